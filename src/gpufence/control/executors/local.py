"""Local executor: runs job attempts as real processes on this machine.

Every gang member is one launcher (``launcher.py``) started in a new session, so the member's
whole process tree is one process group that signals address as a unit. The launcher records
``rank-R.pid`` / ``rank-R.exit`` in the attempt directory; those records let a restarted control
plane re-attach to attempts that kept running (``adopt``) or learn how they ended.

One watcher thread waits (``selectors`` over ``pidfd_open`` descriptors, which also work for
processes that are not our children) for member exits, SIGKILL deadlines and notice acks. Exits
are event-driven: ``on_exit`` fires within milliseconds of the last member's exit.

Threading: every public method may be called from any thread. ``on_exit`` and ``on_ack`` are
called from the watcher thread (also for ``adopt`` of an attempt that already ended), never while
the executor's lock is held, so a callback may call back into the executor; a slow callback
delays the detection of other exits, so callbacks should hand the event off (e.g. to a queue).

Policy worth knowing:

* a gang is all-or-nothing: when a member exits non-zero (or unknown) while others still run, the
  others get SIGTERM and, ``gang_grace_s`` later, SIGKILL;
* when a member's main process (its launcher) has exited, whatever is left in its process group
  (stray background children) is SIGKILLed at once, so nothing outlives the attempt on a GPU;
* ``stop`` and ``notice`` signal process groups, never single processes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufence.control.executors import launcher as _launcher
from gpufence.control.executors.base import (
    AckCallback,
    AttemptExit,
    ExitCallback,
    Launch,
    LaunchError,
)
from gpufence.control.executors.launcher import (
    atomic_write,
    err_file,
    exit_file,
    out_file,
    pid_file,
    pid_record,
    proc_start_time,
    proc_stat_fields,
)

log = logging.getLogger("gpufence.executor")

Key = tuple[str, int]

GANG_GRACE_S = 5.0
"""SIGTERM -> SIGKILL grace for the rest of a gang after one member failed."""
ACK_POLL_S = 0.02
"""How often the watcher looks for the ack file of a noticed attempt."""
_REAP_ON_CLOSE_S = 2.0
_LAUNCHER = Path(_launcher.__file__).resolve()
_CLK_TCK = os.sysconf("SC_CLK_TCK")

# Popen objects of members left running by close(kill=False). Dropping them would make their
# destructor warn and put them on subprocess's cleanup list, whose waitpid() could later reap an
# unrelated child that reused the pid (the adopting executor reaps the real one through a pidfd).
_DISOWNED: list[subprocess.Popen[bytes]] = []


@dataclass(eq=False, slots=True)
class _Member:
    rank: int
    pid: int
    """Launcher pid == the member's process-group id."""
    pidfd: int | None
    popen: subprocess.Popen[bytes] | None
    """Set for members this executor started (our children); None for adopted ones."""
    done: bool = False
    code: int | None = None


@dataclass(eq=False, slots=True)
class _Attempt:
    launch: Launch
    members: list[_Member]
    """In rank order."""
    stop_requested: bool = False
    kill_at: float | None = None
    """Monotonic time at which the live members' groups get SIGKILL."""
    gang_failed: bool = False
    ack_wanted: bool = False
    acked: bool = False
    cpu_base: float = 0.0
    wall_base: float = 0.0

    @property
    def key(self) -> Key:
        return (self.launch.job_id, self.launch.attempt)

    def live(self) -> list[_Member]:
        return [m for m in self.members if not m.done]


def _ignore_exit(ev: AttemptExit) -> None:
    log.warning("attempt %s/%d ended but no on_exit callback is set", ev.job_id, ev.attempt)


def _ignore_ack(job_id: str, attempt: int) -> None:
    log.warning("attempt %s/%d acked but no on_ack callback is set", job_id, attempt)


class LocalExecutor:
    """Runs attempts as local process groups; see the module docstring for threading/policy."""

    def __init__(
        self,
        notice_signal: signal.Signals = signal.SIGUSR1,
        python: str = sys.executable,
        *,
        gang_grace_s: float = GANG_GRACE_S,
    ) -> None:
        self.notice_signal = signal.Signals(notice_signal)
        self.python = python
        self.gang_grace_s = gang_grace_s
        # blocked while the launcher starts; it unblocks them once it can survive them
        self._caught = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, self.notice_signal}
        self._lock = threading.Lock()
        self._attempts: dict[Key, _Attempt] = {}
        self._starting: set[Key] = set()
        self._to_watch: list[tuple[int, Key, int]] = []  # (pidfd, attempt, member index)
        self._dirty: set[Key] = set()
        self._closing = False
        self._kill_on_close = False
        self._on_exit: ExitCallback = _ignore_exit
        self._on_ack: AckCallback = _ignore_ack
        self._efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._efd, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._watch, name="gpufence-executor", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API
    def set_callbacks(self, on_exit: ExitCallback, on_ack: AckCallback) -> None:
        with self._lock:
            self._on_exit = on_exit
            self._on_ack = on_ack

    def start(self, launch: Launch) -> None:
        key = (launch.job_id, launch.attempt)
        _check_launch(launch)
        with self._lock:
            if self._closing:
                raise LaunchError("the executor is closed")
            if key in self._attempts or key in self._starting:
                raise LaunchError(f"attempt {launch.attempt} of job {launch.job_id} is running")
            self._starting.add(key)
        try:
            members = self._spawn(launch)
        except BaseException:
            with self._lock:
                self._starting.discard(key)
            raise
        with self._lock:
            self._starting.discard(key)
            closed = self._closing
            if not closed:
                att = _Attempt(launch, members, wall_base=time.monotonic())
                self._attempts[key] = att
                self._watch_locked(att)
                self._wake_locked()
        if closed:  # closed while we were spawning: leave no strays behind
            for m in members:
                _killpg(m.pid, signal.SIGKILL)
            self._reap_now(members)
            raise LaunchError("the executor was closed while the attempt was starting")
        log.info(
            "started job %s attempt %d: %d member(s), pids %s",
            launch.job_id,
            launch.attempt,
            len(members),
            ",".join(str(m.pid) for m in members),
        )

    def notice(
        self, job_id: str, attempt: int, reason: str, deadline_unix: float, signal_job: bool = True
    ) -> None:
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                log.warning("notice for job %s attempt %d, which is not running", job_id, attempt)
                return
            body = json.dumps({"reason": reason, "deadline_unix": deadline_unix})
            try:
                atomic_write(_notice_path(att.launch), body + "\n")
            except OSError as exc:
                log.error("job %s attempt %d: cannot write notice file: %s", job_id, attempt, exc)
            if signal_job:
                for m in att.live():
                    _killpg(m.pid, self.notice_signal)
            if not att.acked:
                att.ack_wanted = True
            self._wake_locked()
        log.info("noticed job %s attempt %d (%s)", job_id, attempt, reason)

    def stop(self, job_id: str, attempt: int, grace_s: float) -> None:
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                log.debug("stop for job %s attempt %d, which is not running", job_id, attempt)
                return
            first = not att.stop_requested
            att.stop_requested = True
            if first:
                for m in att.live():
                    _killpg(m.pid, signal.SIGTERM)
            self._kill_by_locked(att, time.monotonic() + max(0.0, grace_s))
            self._wake_locked()
        if first:
            log.info("stopping job %s attempt %d (grace %.1fs)", job_id, attempt, grace_s)

    def adopt(self, launch: Launch) -> bool:
        key = (launch.job_id, launch.attempt)
        with self._lock:
            if self._closing:
                raise RuntimeError("the executor is closed")
            if key in self._attempts or key in self._starting:
                return True
        members: list[_Member] = []
        for rank in sorted(m.rank for m in launch.members):
            pid, pidfd = _attach(launch.attempt_dir, rank)
            m = _Member(rank, pid, pidfd, None)
            if pidfd is None:
                m.done = True
                m.code = _recorded_exit(launch.attempt_dir, rank)
            members.append(m)
        att = _Attempt(launch, members)
        alive = att.live()
        att.wall_base = time.monotonic()
        att.cpu_base = _group_cpu(_pgids(members))
        with self._lock:
            if self._closing:
                for m in members:
                    if m.pidfd is not None:
                        os.close(m.pidfd)
                raise RuntimeError("the executor is closed")
            self._attempts[key] = att
            self._watch_locked(att)
            self._dirty.add(key)  # all gone: the watcher reports the exit at once
            failed = [m for m in members if m.done and m.code != 0]
            if failed and alive:
                self._gang_abort_locked(att, failed[0])
            self._wake_locked()
        log.info(
            "adopted job %s attempt %d: %d of %d member(s) alive",
            launch.job_id,
            launch.attempt,
            len(alive),
            len(members),
        )
        return bool(alive)

    def running(self) -> list[tuple[str, int]]:
        with self._lock:
            return list(self._attempts)

    def activity(self) -> dict[tuple[str, int], float]:
        with self._lock:
            groups = {key: _pgids(att.members) for key, att in self._attempts.items()}
        per_group = _group_cpu_by_pgid({pgid for pgids in groups.values() for pgid in pgids})
        now = time.monotonic()
        out: dict[tuple[str, int], float] = {}
        with self._lock:
            for key, pgids in groups.items():
                att = self._attempts.get(key)
                if att is None:
                    continue
                cpu = sum(per_group.get(pgid, 0.0) for pgid in pgids)
                dt = now - att.wall_base
                n = max(1, len(att.members))
                util = (cpu - att.cpu_base) / dt / n if dt > 0 else 0.0
                att.cpu_base, att.wall_base = cpu, now
                out[key] = min(1.0, max(0.0, util))
        return out

    def close(self, kill: bool = False) -> None:
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._kill_on_close = kill
            if kill:
                for att in self._attempts.values():
                    for m in att.live():
                        _killpg(m.pid, signal.SIGKILL)
            self._wake_locked()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    # ------------------------------------------------------------------ spawning
    def _spawn(self, launch: Launch) -> list[_Member]:
        adir = launch.attempt_dir.absolute()
        try:
            adir.mkdir(parents=True, exist_ok=True)
            launch.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LaunchError(f"cannot create the attempt/checkpoint directory: {exc}") from exc
        ranks = range(len(launch.members))
        for rank in ranks:
            pid, pidfd = _attach(adir, rank)
            if pidfd is not None:
                os.close(pidfd)
                raise LaunchError(
                    f"{adir} already has a live rank {rank} (pid {pid}): adopt it, don't start it"
                )
        try:
            for name in ("notice", "ack"):
                (adir / name).unlink(missing_ok=True)
            for rank in ranks:
                pid_file(adir, rank).unlink(missing_ok=True)
                exit_file(adir, rank).unlink(missing_ok=True)
                out_file(adir, rank).write_bytes(b"")
                err_file(adir, rank).write_bytes(b"")
        except OSError as exc:
            raise LaunchError(f"cannot prepare {adir}: {exc}") from exc

        envs = _member_envs(launch, adir)
        started: list[_Member] = []
        try:
            for member in sorted(launch.members, key=lambda m: m.rank):
                started.append(self._spawn_member(launch, adir, member.rank, envs[member.rank]))
        except BaseException:
            for m in started:
                _killpg(m.pid, signal.SIGKILL)
            self._reap_now(started)
            raise
        return started

    def _spawn_member(self, launch: Launch, adir: Path, rank: int, env: dict[str, str]) -> _Member:
        argv = [self.python, "-I", "-S", str(_LAUNCHER), str(adir), "--rank", str(rank)]
        argv += ["--catch", str(int(self.notice_signal)), "--", *launch.command]
        # The launcher inherits this thread's mask: it starts with the stop/notice signals
        # blocked and unblocks them once its no-op handlers are in place.
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, self._caught)
        try:
            with open(err_file(adir, rank), "ab") as err:
                popen = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=launch.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    start_new_session=True,
                    close_fds=True,
                )
        except (OSError, ValueError) as exc:
            raise LaunchError(f"cannot start rank {rank} of job {launch.job_id}: {exc}") from exc
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        member = _Member(rank, popen.pid, None, popen)
        try:
            member.pidfd = os.pidfd_open(popen.pid)
        except OSError as exc:
            _killpg(popen.pid, signal.SIGKILL)
            popen.wait()
            raise LaunchError(f"pidfd_open failed for rank {rank}: {exc}") from exc
        start_time = proc_start_time(popen.pid)
        if start_time is not None:  # same record the launcher writes; covers a crash in between
            try:
                atomic_write(pid_file(adir, rank), pid_record(popen.pid, start_time))
            except OSError as exc:
                log.warning("job %s rank %d: cannot write pid file: %s", launch.job_id, rank, exc)
        return member

    def _reap_now(self, members: Iterable[_Member]) -> None:
        """Wait (bounded) for killed members and close their pidfds; used off the watcher."""
        deadline = time.monotonic() + _REAP_ON_CLOSE_S
        for m in members:
            if m.pidfd is not None:
                _wait_readable(m.pidfd, deadline - time.monotonic())
                _settle(m, _waitid(m.pidfd))
                os.close(m.pidfd)
                m.pidfd = None
            elif m.popen is not None and m.popen.returncode is None:
                try:
                    m.popen.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _DISOWNED.append(m.popen)

    # ------------------------------------------------------------------ watcher thread
    def _wake_locked(self) -> None:
        if self._efd >= 0:
            os.eventfd_write(self._efd, 1)

    def _watch_locked(self, att: _Attempt) -> None:
        """Queue the attempt's pidfds; the watcher registers them (it alone owns the selector)."""
        for i, m in enumerate(att.members):
            if m.pidfd is not None:
                self._to_watch.append((m.pidfd, att.key, i))

    def _kill_by_locked(self, att: _Attempt, deadline: float) -> None:
        att.kill_at = deadline if att.kill_at is None else min(att.kill_at, deadline)

    def _gang_abort_locked(self, att: _Attempt, failed: _Member) -> None:
        att.gang_failed = True
        log.warning(
            "job %s attempt %d: rank %d ended with %s; stopping the rest of the gang",
            att.launch.job_id,
            att.launch.attempt,
            failed.rank,
            failed.code,
        )
        for m in att.live():
            _killpg(m.pid, signal.SIGTERM)
        self._kill_by_locked(att, time.monotonic() + self.gang_grace_s)

    def _watch(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._closing:
                        break
                    for fd, key, index in self._to_watch:
                        self._sel.register(fd, selectors.EVENT_READ, (key, index))
                    self._to_watch.clear()
                    timeout = self._timeout_locked(time.monotonic())
                ready = self._sel.select(timeout)
                with self._lock:
                    if self._closing:
                        break
                    for skey, _ in ready:
                        if skey.data is None:
                            _drain(self._efd)
                            continue
                        key, index = skey.data
                        self._sel.unregister(skey.fd)
                        att = self._attempts[key]
                        self._exited_locked(att, att.members[index])
                    self._kill_due_locked(time.monotonic())
                    acks = [att.key for att in self._attempts.values() if self._acked_locked(att)]
                    exits = self._finalize_locked()
                    on_exit, on_ack = self._on_exit, self._on_ack
                for job_id, attempt in acks:
                    _call(on_ack, job_id, attempt)
                for ev in exits:
                    _call(on_exit, ev)
        except Exception:
            log.exception("executor watcher failed; no further exits will be reported")
        finally:
            self._shutdown()

    def _timeout_locked(self, now: float) -> float | None:
        timeout: float | None = None
        for att in self._attempts.values():
            if att.kill_at is not None:
                left = max(0.0, att.kill_at - now)
                timeout = left if timeout is None else min(timeout, left)
            if att.ack_wanted and not att.acked:
                timeout = ACK_POLL_S if timeout is None else min(timeout, ACK_POLL_S)
        if self._dirty:
            timeout = 0.0
        return timeout

    def _exited_locked(self, att: _Attempt, m: _Member) -> None:
        # Leftovers of the member's group die with it. Signalled before the reap, while the
        # zombie leader still pins the group id, so the id cannot name anyone else's group.
        _killpg(m.pid, signal.SIGKILL)
        if m.pidfd is not None:
            status = _waitid(m.pidfd)
            os.close(m.pidfd)
            m.pidfd = None
        else:
            status = None
        recorded = _recorded_exit(att.launch.attempt_dir, m.rank)
        _settle(m, recorded if recorded is not None else status)
        self._dirty.add(att.key)
        log.debug(
            "job %s attempt %d rank %d exited: %s",
            att.launch.job_id,
            att.launch.attempt,
            m.rank,
            m.code,
        )
        if m.code != 0 and not att.stop_requested and not att.gang_failed and att.live():
            self._gang_abort_locked(att, m)

    def _kill_due_locked(self, now: float) -> None:
        for att in self._attempts.values():
            if att.kill_at is not None and att.kill_at <= now:
                att.kill_at = None
                live = att.live()
                if live:
                    log.warning(
                        "job %s attempt %d: grace over, SIGKILL to %d member(s)",
                        att.launch.job_id,
                        att.launch.attempt,
                        len(live),
                    )
                for m in live:
                    _killpg(m.pid, signal.SIGKILL)

    def _acked_locked(self, att: _Attempt) -> bool:
        if not att.ack_wanted or att.acked:
            return False
        if not _ack_path(att.launch).exists():
            return False
        att.acked = True
        return True

    def _finalize_locked(self) -> list[AttemptExit]:
        exits: list[AttemptExit] = []
        for key in sorted(self._dirty):
            att = self._attempts.get(key)
            if att is None or att.live():
                continue
            del self._attempts[key]
            codes = tuple(m.code for m in att.members)
            ev = AttemptExit(
                job_id=att.launch.job_id,
                attempt=att.launch.attempt,
                succeeded=bool(codes) and all(c == 0 for c in codes),
                codes=codes,
                stopped=att.stop_requested,
            )
            log.info(
                "job %s attempt %d ended: codes %s%s",
                ev.job_id,
                ev.attempt,
                list(codes),
                " (stopped)" if ev.stopped else "",
            )
            exits.append(ev)
        self._dirty.clear()
        return exits

    def _shutdown(self) -> None:
        with self._lock:
            self._closing = True
            kill = self._kill_on_close
            members = [m for att in self._attempts.values() for m in att.members]
            self._attempts.clear()
            self._to_watch.clear()
            self._dirty.clear()
            self._sel.close()
            os.close(self._efd)
            self._efd = -1
        if kill:
            self._reap_now(members)
            return
        for m in members:
            if m.pidfd is not None:
                os.close(m.pidfd)
                m.pidfd = None
            if m.popen is not None and m.popen.returncode is None:
                _DISOWNED.append(m.popen)


# ---------------------------------------------------------------------- helpers
def _check_launch(launch: Launch) -> None:
    where = f"job {launch.job_id} attempt {launch.attempt}"
    if launch.attempt < 1:
        raise LaunchError(f"{where}: attempt numbers start at 1")
    if not launch.members:
        raise LaunchError(f"{where}: no members")
    ranks = sorted(m.rank for m in launch.members)
    if ranks != list(range(len(ranks))):
        raise LaunchError(f"{where}: member ranks must be 0..{len(ranks) - 1}, got {ranks}")
    if not launch.command or not launch.command[0]:
        raise LaunchError(f"{where}: empty command")
    if launch.cwd is not None and not launch.cwd.is_dir():
        raise LaunchError(f"{where}: working directory {launch.cwd} does not exist")


def _member_envs(launch: Launch, adir: Path) -> dict[int, dict[str, str]]:
    base = dict(os.environ)
    base.update(launch.env)
    base.update(
        {
            "GPUFENCE_JOB_ID": launch.job_id,
            "GPUFENCE_ATTEMPT": str(launch.attempt),
            "GPUFENCE_CHECKPOINT_DIR": str(launch.checkpoint_dir.absolute()),
            "GPUFENCE_NOTICE_FILE": str(adir / "notice"),
            "GPUFENCE_ACK_FILE": str(adir / "ack"),
            "WORLD_SIZE": str(len(launch.members)),
            "GPUFENCE_WORLD_SIZE": str(len(launch.members)),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
        }
    )
    members = sorted(launch.members, key=lambda m: m.rank)
    per_node: dict[str, int] = {}
    for m in members:
        per_node[m.node] = per_node.get(m.node, 0) + 1
    seen: dict[str, int] = {}
    envs: dict[int, dict[str, str]] = {}
    for m in members:
        local = seen.get(m.node, 0)
        seen[m.node] = local + 1
        env = dict(base)
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": ",".join(m.devices),  # "" = no GPU visible
                "RANK": str(m.rank),
                "GPUFENCE_RANK": str(m.rank),
                "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(per_node[m.node]),
            }
        )
        envs[m.rank] = env
    return envs


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _notice_path(launch: Launch) -> Path:
    return launch.attempt_dir / "notice"


def _ack_path(launch: Launch) -> Path:
    return launch.attempt_dir / "ack"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _recorded_exit(adir: Path, rank: int) -> int | None:
    rec = _read_json(exit_file(adir, rank))
    code = rec.get("code") if rec is not None else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _attach(adir: Path, rank: int) -> tuple[int, int | None]:
    """(pid, pidfd) of the member recorded in ``rank-R.pid`` if that very process still runs.

    The recorded start time guards against pid reuse; a zombie counts as gone (it is reaped
    here when it is our own child).
    """
    rec = _read_json(pid_file(adir, rank))
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
        _waitid(fd)
        os.close(fd)
        return pid, None
    return pid, fd


def _waitid(pidfd: int) -> int | None:
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


def _settle(m: _Member, code: int | None) -> None:
    m.done = True
    m.code = code
    if m.popen is not None and m.popen.returncode is None:
        # reaped through the pidfd; tell Popen so it never waitpid()s a possibly reused pid
        m.popen.returncode = code if code is not None else -signal.SIGKILL


def _wait_readable(fd: int, timeout: float) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        sel.select(max(0.0, timeout))


def _killpg(pgid: int, sig: signal.Signals) -> None:
    if pgid <= 1:
        return
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as exc:
        log.warning("cannot send %s to process group %d: %s", sig.name, pgid, exc)


def _drain(efd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        os.eventfd_read(efd)


def _call(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("executor callback %r failed", fn)


def _pgids(members: Iterable[_Member]) -> set[int]:
    # pid 0 = no record; process group 0 holds kernel threads, which are nobody's job
    return {m.pid for m in members if m.pid > 1}


def _group_cpu_by_pgid(pgids: set[int]) -> dict[int, float]:
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


def _group_cpu(pgids: set[int]) -> float:
    return sum(_group_cpu_by_pgid(pgids).values())
