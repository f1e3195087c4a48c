"""The processes of a running gang member: /proc reads, process groups, pid/exit records.

A member is one launcher (``launcher.py``) started as the leader of a new process group, so its
process tree is one process group (pgid == launcher pid), and, with containment, the job's processes
are in the member's cgroup (``MemberProcess.cgroup``), which also holds those that left the process
group (``setsid``, daemons). The launcher records ``rank-R.pid`` / ``rank-R.exit`` in the attempt's
records directory (the control plane's; ``member_records.records_dir``); ``attach`` re-finds a
recorded member that still runs (guarding against pid reuse with the recorded start time) and
``recorded_exit`` reads how one ended. Processes are waited for and reaped through pidfds, which
also work for processes that are not our children.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpufence.control.base import launcher as _launcher
from gpufence.control.base.member_records import (
    atomic_write,
    err_file,
    launcher_env,
    open_log,
    pid_file,
    pid_record,
    proc_start_time,
    proc_stat_fields,
)
from gpufence.control.base.record_reads import recorded_exit, recorded_launcher, recorded_pid
from gpufence.control.containment.cgroup import MemberCgroup

LAUNCHER = Path(_launcher.__file__).resolve()

log = logging.getLogger("gpufence.executor")

REAP_ON_CLOSE_S = 2.0
"""How long ``reap_now`` waits, in all, for killed members to exit."""
_CLK_TCK = os.sysconf("SC_CLK_TCK")

# Popen objects of members left running by close(kill=False). Dropping them would make their
# destructor warn and put them on subprocess's cleanup list, whose waitpid() could later reap an
# unrelated child that reused the pid (the adopting executor reaps the real one through a pidfd).
DISOWNED: list[subprocess.Popen[bytes]] = []


@dataclass(eq=False, slots=True)
class MemberProcess:
    """One gang member as run here: its launcher process (and so its process group)."""

    rank: int
    pid: int
    """Launcher pid == the member's process-group id."""
    pidfd: int | None
    popen: subprocess.Popen[bytes] | None
    """Set for members this executor started with ``Popen`` (our children); else None."""
    done: bool = False
    """The launcher (and so the job's main process) has exited; ``code`` is known."""
    code: int | None = None
    cgroup: MemberCgroup | None = None
    """The member's cgroup (containment on); None: its process group is all there is."""
    drained: bool = False
    """Its cgroup was seen empty after ``done``: only then are its GPUs free."""
    strays: int = 0
    """Processes still in the cgroup after the main process ended, killed by the executor."""
    oom: bool = False
    forked: int = 0
    """Generation of the fork server that forked the launcher (0: not forked by it)."""
    drain_since: float = 0.0
    rekill_at: float = 0.0

    @property
    def over(self) -> bool:
        """Ended and, with a cgroup, emptied: the member holds nothing any more."""
        return self.done and (self.cgroup is None or self.drained)


def attach(adir: Path, rank: int) -> tuple[int, int | None]:
    """(pid, pidfd) of the member recorded in ``rank-R.pid`` if that very process still runs;
    if it does not, a pidfd of its launcher (``rank-R.started``), in which the member lives on
    when only its supervisor was killed (``supervisor.py``).

    The recorded start time guards against pid reuse; a zombie counts as gone (it is reaped
    here when it is our own child).
    """
    rec = recorded_pid(adir, rank)
    if rec is None:
        return 0, None
    fd = open_live(*rec)
    if fd is None:
        launcher = recorded_launcher(adir, rank)
        if launcher is not None and recorded_exit(adir, rank) is None:
            # the pid stays the recorded one: the id of the member's process group, which the
            # kernel does not hand out again while the launcher keeps the group alive
            fd = open_live(*launcher)
    return rec[0], fd


def only_child(pid: int) -> int | None:
    """The one child of ``pid`` (``/proc/<pid>/task/<pid>/children``), or None: a member's
    supervisor has exactly one, its launcher."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
            kids = fh.read().split()
    except OSError:
        return None
    return int(kids[0]) if len(kids) == 1 else None


def open_live(pid: int, start_time: int) -> int | None:
    """A pidfd of ``pid`` if that very process (its start time) runs and is no zombie."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    # checked after the open: if it matches now, the pidfd was opened on that same process
    fields = proc_stat_fields(pid)
    if fields is None or len(fields) < 20 or int(fields[19]) != start_time:
        os.close(fd)
        return None
    if fields[0] in ("Z", "X"):
        waitid(fd)
        os.close(fd)
        return None
    return fd


def waitid(pidfd: int) -> int | None:
    """Reap the process behind ``pidfd`` if it is our exited child; its exit code or None."""
    try:
        res = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
    except (ChildProcessError, OSError):
        return None
    if res is None:
        return None
    if res.si_code == os.CLD_EXITED:
        return res.si_status
    return -res.si_status  # CLD_KILLED / CLD_DUMPED


def settle(m: MemberProcess, code: int | None) -> None:
    m.done = True
    m.code = code
    if m.popen is not None and m.popen.returncode is None:
        # reaped through the pidfd; tell Popen so it never waitpid()s a possibly reused pid
        m.popen.returncode = code if code is not None else -signal.SIGKILL


def wait_readable(fd: int, timeout: float) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        sel.select(max(0.0, timeout))


def killpg(pgid: int, sig: signal.Signals) -> None:
    if pgid <= 1:
        return
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as exc:
        log.warning("cannot send %s to process group %d: %s", sig.name, pgid, exc)


def member_pgids(members: Iterable[MemberProcess]) -> set[int]:
    # pid 0 = no record; process group 0 holds kernel threads, which are nobody's job
    return {m.pid for m in members if m.pid > 1}


def group_cpu_by_pgid(pgids: set[int]) -> dict[int, float]:
    """CPU seconds (utime+stime, plus reaped children's) per process group, from /proc."""
    totals = dict.fromkeys(pgids, 0)
    if not pgids:
        return {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if not name.isdigit():
            continue
        fields = proc_stat_fields(int(name))
        if fields is None or len(fields) < 15:
            continue
        pgrp = int(fields[2])  # field 5
        if pgrp in totals:
            totals[pgrp] += sum(int(f) for f in fields[11:15])  # fields 14-17
    return {pgid: ticks / _CLK_TCK for pgid, ticks in totals.items()}


def group_cpu(pgids: set[int]) -> float:
    return sum(group_cpu_by_pgid(pgids).values())


def reap_now(members: Iterable[MemberProcess]) -> None:
    """Wait (bounded) for killed members and close their pidfds; used off the watcher."""
    deadline = time.monotonic() + REAP_ON_CLOSE_S
    for m in members:
        if m.pidfd is not None:
            wait_readable(m.pidfd, deadline - time.monotonic())
            settle(m, waitid(m.pidfd))
            os.close(m.pidfd)
            m.pidfd = None
        elif m.popen is not None and m.popen.returncode is None:
            try:
                m.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                DISOWNED.append(m.popen)


class SpawnError(RuntimeError):
    """A member's launcher could not be started (the message says why)."""


def launcher_argv(
    adir: Path,
    rank: int,
    command: Iterable[str],
    caught: set[signal.Signals],
    confine: Iterable[str] = (),
    fence_parent: bool = False,
    log_limit: int | None = None,
    pty_grace: float | None = None,
) -> list[str]:
    """The launcher's arguments (after the interpreter and script): see ``launcher.py``."""
    argv = [str(adir), "--rank", str(rank)]
    for sig in sorted(caught):
        argv += ["--catch", str(int(sig))]
    if log_limit is not None:
        argv += ["--log-limit", str(log_limit)]
    if pty_grace is not None:
        argv += ["--pty-grace", f"{pty_grace:g}"]
    if fence_parent:  # the member dies with its starter (Ray agents; see launcher.py)
        argv += ["--fence-parent", str(os.getpid())]
    return [*argv, *confine, "--", *command]


def spawn_member(
    python: str,
    adir: Path,
    rank: int,
    command: Iterable[str],
    env: dict[str, str],
    caught: set[signal.Signals],
    fence_parent: bool = False,
    confine: Iterable[str] = (),
    log_limit: int | None = None,
) -> MemberProcess:
    """Start one gang member: the launcher (``python -I -S``: no site, ~20 ms sooner) in its own
    session, told to survive ``caught`` (which it forwards to the command's group) and confined by
    ``confine`` (``containment.members.launcher_args``: cgroup, user, working directory). It
    inherits this thread's mask, so it starts with those signals blocked and unblocks them once its
    handlers are in place: a stop sent right after the spawn is never lost. Its pid record is
    written here too, so a crash before the launcher writes it still leaves one."""
    args = launcher_argv(adir, rank, command, caught, confine, fence_parent, log_limit)
    argv = [python, "-I", "-S", str(LAUNCHER), *args]
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, caught)
    try:
        err = open_log(err_file(adir, rank))  # in the job's directory: no link followed
        try:
            popen = subprocess.Popen(
                argv,
                env={**env, **launcher_env()},  # the launcher's own; it keeps them from the job
                cwd="/",  # the launcher's; the job enters its own (--cwd) as its own user
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(err)
    except (OSError, ValueError) as exc:
        raise SpawnError(f"cannot start rank {rank}: {exc}") from exc
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    try:
        pidfd = os.pidfd_open(popen.pid)
    except OSError as exc:
        killpg(popen.pid, signal.SIGKILL)
        popen.wait()
        raise SpawnError(f"pidfd_open failed for rank {rank}: {exc}") from exc
    start_time = proc_start_time(popen.pid)
    if start_time is not None:
        try:
            atomic_write(pid_file(adir, rank), pid_record(popen.pid, start_time))
        except OSError as exc:
            log.warning("%s rank %d: cannot write pid file: %s", adir, rank, exc)
    return MemberProcess(rank, popen.pid, pidfd, popen)
