"""The processes of a running gang member: /proc reads, process groups, pid/exit records.

A member is one launcher (``launcher.py``) started in a new session, so its whole process tree is
one process group (pgid == launcher pid). The launcher records ``rank-R.pid`` / ``rank-R.exit``
in the attempt directory; ``attach`` re-finds a recorded member that still runs (guarding against
pid reuse with the recorded start time) and ``recorded_exit`` reads how one ended. Processes are
waited for and reaped through pidfds, which also work for processes that are not our children.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufence.control.executors import launcher as _launcher
from gpufence.control.executors.launcher import (
    atomic_write,
    err_file,
    exit_file,
    pid_file,
    pid_record,
    proc_start_time,
    proc_stat_fields,
    spool_file,
)

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
    """Set for members this executor started (our children); None for adopted ones."""
    done: bool = False
    code: int | None = None


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _code(rec: dict[str, Any] | None) -> int | None:
    code = rec.get("code") if rec is not None else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def recorded_exit(adir: Path, rank: int) -> int | None:
    """The member's recorded exit code: from ``rank-R.exit`` or, where the launcher could not
    write there (full / read-only disk), from the spool; None if it has none."""
    code = _code(read_json(exit_file(adir, rank)))
    return code if code is not None else _code(read_json(spool_file(adir, rank)))


def forget_spooled_exits(adir: Path, ranks: int) -> None:
    """The control plane has persisted this attempt's exit: spooled records may go."""
    for rank in range(ranks):
        try:
            spool_file(adir, rank).unlink(missing_ok=True)
        except OSError as exc:
            log.debug("cannot remove the spooled exit record of %s rank %d: %s", adir, rank, exc)


SPOOL_KEEP_S = 7 * 86400.0


def prune_spool(max_age_s: float = SPOOL_KEEP_S) -> int:
    """Drop spooled exit records older than ``max_age_s`` (their data directory went away
    before its control plane could persist them); returns how many."""
    spool = spool_file(Path("/"), 0).parent
    try:
        entries = list(spool.iterdir())
    except OSError:
        return 0
    cutoff = time.time() - max_age_s
    dropped = 0
    for path in entries:
        try:
            if path.name.endswith(".exit") and path.stat().st_mtime < cutoff:
                path.unlink()
                dropped += 1
        except OSError:
            continue
    return dropped


# ---------------------------------------------------------------------- members whose launcher died
LEFTOVER_WAIT_S = 10.0
"""How long adoption waits for the killed leftovers of a member to be gone."""


def _recorded_pid(adir: Path, rank: int) -> tuple[int, int] | None:
    rec = read_json(pid_file(adir, rank))
    if rec is None:
        return None
    pid, start = rec.get("pid"), rec.get("start_time")
    if not isinstance(pid, int) or not isinstance(start, int) or pid <= 1:
        return None
    return pid, start


def group_leftovers(pgid: int, leader_start: int) -> list[int]:
    """Live processes of the process group whose leader (the member's launcher, pid ==
    ``pgid``, started at ``leader_start``) has exited: what a dead launcher leaves running.

    While any process is in the group, the kernel does not reuse the number ``pgid``; so if a
    process with that pid runs and it is not the launcher, the group is long gone and the pid
    was reused: nothing is ours. Zombies count as gone (they hold nothing)."""
    if pgid <= 1:
        return []
    now = proc_start_time(pgid)
    if now is not None and now != leader_start:
        return []
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        fields = proc_stat_fields(int(name))
        if fields is None or len(fields) < 20 or fields[0] in ("Z", "X"):
            continue
        if int(fields[2]) == pgid and int(fields[19]) >= leader_start:
            out.append(int(name))
    return out


def kill_group_leftovers(adir: Path, rank: int, wait_s: float = LEFTOVER_WAIT_S) -> list[int]:
    """SIGKILL whatever is left of rank ``rank``'s process group and wait until it is gone,
    so nothing of this attempt still runs on its GPUs when the job is run again. Returns the
    pids it found (empty: nothing was left)."""
    rec = _recorded_pid(adir, rank)
    if rec is None:
        return []
    pgid, start = rec
    left = group_leftovers(pgid, start)
    if not left:
        return []
    log.warning(
        "%s rank %d: its launcher is gone but %d process(es) of its group still run (%s); "
        "killing them before the attempt is settled",
        adir,
        rank,
        len(left),
        ",".join(map(str, left[:8])),
    )
    killpg(pgid, signal.SIGKILL)
    end = time.monotonic() + wait_s
    while group_leftovers(pgid, start):
        if time.monotonic() > end:
            log.error("%s rank %d: processes of its group survive SIGKILL", adir, rank)
            break
        time.sleep(0.01)
    record_lost(adir, rank, "killed at adoption: its launcher was gone")
    return left


def record_lost(adir: Path, rank: int, why: str) -> None:
    """An exit record with no code (the member's outcome is unknown) but the time its last
    process was gone, so histories read from the attempt directory close its interval."""
    if recorded_exit(adir, rank) is not None:
        return
    text = json.dumps({"code": None, "ended_unix": time.time(), "lost": why}) + "\n"
    try:
        atomic_write(exit_file(adir, rank), text, fsync=True)
    except OSError as exc:
        log.warning("%s rank %d: cannot record its end: %s", adir, rank, exc)


def settle_untracked_attempt(adir: Path, ranks: int) -> tuple[int | None, ...]:
    """An attempt directory the store has no record of (it lost its last writes: a power cut,
    a failed disk repaired by fsck): stop whatever of it still runs, kill its groups' leftovers,
    and return each rank's recorded code (None: unknown). Nothing of it runs afterwards."""
    for rank in range(ranks):
        pid, fd = attach(adir, rank)
        if fd is not None:
            killpg(pid, signal.SIGKILL)
            _wait_readable(fd, LEFTOVER_WAIT_S)
            waitid(fd)
            os.close(fd)
        kill_group_leftovers(adir, rank)
    return tuple(recorded_exit(adir, rank) for rank in range(ranks))


def live_member_pids(adir: Path) -> list[int]:
    """Pids of this attempt directory's members that still run: live launchers, or the
    leftovers of one that died (both hold the attempt's GPUs)."""
    out: list[int] = []
    for path in sorted(adir.glob("rank-*.pid")):
        rank_s = path.name.removeprefix("rank-").removesuffix(".pid")
        if not rank_s.isdigit():
            continue
        pid, fd = attach(adir, int(rank_s))
        if fd is not None:
            os.close(fd)
            out.append(pid)
            continue
        rec = _recorded_pid(adir, int(rank_s))
        if rec is not None:
            out += group_leftovers(*rec)
    return out


def attach(adir: Path, rank: int) -> tuple[int, int | None]:
    """(pid, pidfd) of the member recorded in ``rank-R.pid`` if that very process still runs.

    The recorded start time guards against pid reuse; a zombie counts as gone (it is reaped
    here when it is our own child).
    """
    rec = read_json(pid_file(adir, rank))
    if rec is None:
        return 0, None
    pid, start_time = rec.get("pid"), rec.get("start_time")
    if not isinstance(pid, int) or not isinstance(start_time, int) or pid <= 0:
        return 0, None
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return pid, None
    # checked after the open: if it matches now, the pidfd was opened on that same process
    fields = proc_stat_fields(pid)
    if fields is None or len(fields) < 20 or int(fields[19]) != start_time:
        os.close(fd)
        return pid, None
    if fields[0] in ("Z", "X"):
        waitid(fd)
        os.close(fd)
        return pid, None
    return pid, fd


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


def _wait_readable(fd: int, timeout: float) -> None:
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
            _wait_readable(m.pidfd, deadline - time.monotonic())
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


def spawn_member(
    python: str,
    adir: Path,
    rank: int,
    command: Iterable[str],
    env: dict[str, str],
    cwd: str | Path | None,
    caught: set[signal.Signals],
    fence_parent: bool = False,
) -> MemberProcess:
    """Start one gang member: the launcher (``python -I -S``: no site, ~20 ms sooner) in its own
    session, told to survive ``caught`` (which it forwards to the command's group). It inherits
    this thread's mask, so it starts with those signals blocked and unblocks them once its
    handlers are in place: a stop sent right after the spawn is never lost. Its pid record is
    written here too, so a crash before the launcher writes it still leaves one."""
    argv = [python, "-I", "-S", str(LAUNCHER), str(adir), "--rank", str(rank)]
    for sig in sorted(caught):
        argv += ["--catch", str(int(sig))]
    if fence_parent:  # the member dies with its starter (Ray agents; see launcher.py)
        argv += ["--fence-parent", str(os.getpid())]
    argv += ["--", *command]
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, caught)
    try:
        with open(err_file(adir, rank), "ab") as err:
            popen = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
                close_fds=True,
            )
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
