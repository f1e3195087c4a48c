"""Local executor: runs job attempts as real processes on this machine.

Every gang member is one launcher (``launcher.py``) started in a new session, so the member's
whole process tree is one process group that signals address as a unit. The launcher records
``rank-R.pid`` / ``rank-R.exit`` in the attempt directory; those records let a restarted control
plane re-attach to attempts that kept running (``adopt``) or learn how they ended.

One watcher thread (``watcher.AttemptWatcher``, which ``LocalExecutor`` extends) waits for
member exits, SIGKILL deadlines and notice acks; exits are event-driven: ``on_exit`` fires within
milliseconds of the last member's exit. Process-group, /proc and pid/exit-record helpers are in
``processes.py``.

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

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from gpufence.control import failpoints
from gpufence.control.executors.interface import (
    AckCallback,
    ExitCallback,
    Launch,
    LaunchError,
    NodeCallback,
)
from gpufence.control.executors.jobdirs import prepare_launch_dirs
from gpufence.control.executors.launcher import (
    atomic_write,
    err_file,
    exit_file,
    out_file,
    pid_file,
    reserved_exit_record,
)
from gpufence.control.executors.memberenv import member_envs
from gpufence.control.executors.processes import (
    MemberProcess,
    SpawnError,
    attach,
    group_cpu,
    group_cpu_by_pgid,
    kill_group_leftovers,
    killpg,
    member_pgids,
    reap_now,
    record_lost,
    recorded_exit,
    spawn_member,
)
from gpufence.control.executors.watcher import Attempt, AttemptWatcher, Key

log = logging.getLogger("gpufence.executor")

GANG_GRACE_S = 5.0
"""SIGTERM -> SIGKILL grace for the rest of a gang after one member failed."""


class LocalExecutor(AttemptWatcher):
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
        # blocked while the launcher starts; it unblocks them once it can survive them
        self._caught = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, self.notice_signal}
        self._starting: set[Key] = set()
        super().__init__(gang_grace_s)  # starts the watcher thread

    # ------------------------------------------------------------------ public API
    def set_callbacks(self, on_exit: ExitCallback, on_ack: AckCallback) -> None:
        with self._lock:
            self._on_exit = on_exit
            self._on_ack = on_ack

    def set_node_callback(self, on_node: NodeCallback) -> None:
        """One machine: no node ever goes down while this process runs on it."""

    def start(self, launch: Launch) -> None:
        key = (launch.job_id, launch.attempt)
        check_launch(launch)
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
                att = Attempt(launch, members=members, wall_base=time.monotonic())
                self._attempts[key] = att
                self._watch_locked(att)
                self._wake_locked()
        if closed:  # closed while we were spawning: leave no strays behind
            for m in members:
                killpg(m.pid, signal.SIGKILL)
            reap_now(members)
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
                    killpg(m.pid, self.notice_signal)
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
            first = att.request_stop(time.monotonic() + max(0.0, grace_s))
            if first:
                for m in att.live():
                    killpg(m.pid, signal.SIGTERM)
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
        members = adopt_members(launch)
        att = Attempt(launch, members=members)
        alive = att.live()
        att.wall_base = time.monotonic()
        att.cpu_base = group_cpu(member_pgids(members))
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
            groups = {key: member_pgids(att.members) for key, att in self._attempts.items()}
        per_group = group_cpu_by_pgid({pgid for pgids in groups.values() for pgid in pgids})
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
                        killpg(m.pid, signal.SIGKILL)
            self._wake_locked()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    # ------------------------------------------------------------------ spawning
    def _spawn(self, launch: Launch) -> list[MemberProcess]:
        adir = launch.attempt_dir.absolute()
        prepare_launch_dirs(launch)  # 0700, owned by the job's run_as user
        ranks = range(len(launch.members))
        for rank in ranks:
            pid, pidfd = attach(adir, rank)
            if pidfd is not None:
                os.close(pidfd)
                raise LaunchError(
                    f"{adir} already has a live rank {rank} (pid {pid}): adopt it, don't start it"
                )
        prepare_attempt_dir(adir, len(launch.members))

        envs = member_envs(launch, "127.0.0.1", _free_port(), inherit=os.environ)
        started: list[MemberProcess] = []
        try:
            for member in sorted(launch.members, key=lambda m: m.rank):
                if started:
                    failpoints.hit("executor.between-spawns")
                started.append(self._spawn_member(launch, adir, member.rank, envs[member.rank]))
        except BaseException:
            for m in started:
                killpg(m.pid, signal.SIGKILL)
            reap_now(started)
            raise
        return started

    def _spawn_member(
        self, launch: Launch, adir: Path, rank: int, env: dict[str, str]
    ) -> MemberProcess:
        try:
            return spawn_member(
                self.python, adir, rank, launch.command, env, launch.cwd, self._caught
            )
        except SpawnError as exc:
            raise LaunchError(f"job {launch.job_id}: {exc}") from exc


# ---------------------------------------------------------------------- helpers
def prepare_attempt_dir(adir: Path, ranks: int) -> None:
    """Ready a fresh attempt directory: an attempt runs once, so one that has run before (a
    record of any member) is refused rather than overwritten; logs are created, never
    truncated; each member's exit record is reserved now, while the disk has room for it
    (see ``launcher.write_exit_record``)."""
    for rank in range(ranks):
        for path in (pid_file(adir, rank), adir / f"rank-{rank}.started"):
            if path.exists():
                raise LaunchError(
                    f"{adir} was started before ({path.name} exists): an attempt never runs twice"
                )
    try:
        for name in ("notice", "ack"):
            (adir / name).unlink(missing_ok=True)
        for rank in range(ranks):
            for path in (out_file(adir, rank), err_file(adir, rank)):
                with open(path, "ab"):
                    pass
            atomic_write(exit_file(adir, rank), reserved_exit_record())
    except OSError as exc:
        raise LaunchError(f"cannot prepare {adir}: {exc}") from exc


def adopt_members(launch: Launch) -> list[MemberProcess]:
    """Re-find an attempt's members after a restart, making the attempt's state exact first:

    * a member whose launcher is gone: whatever is left of its process group (the command,
      its children) is killed and waited for, so it cannot run beside the attempt that
      replaces this one; its code is the recorded one, else unknown (lost);
    * a gang only partly spawned (the control plane died between two spawns: a rank has no
      pid record at all): the spawned members are killed too and every code is unknown, so
      the attempt is settled as lost and requeued as the next attempt, not failed.
    """
    adir = launch.attempt_dir
    members: list[MemberProcess] = []
    never_spawned = False
    for rank in sorted(m.rank for m in launch.members):
        pid, pidfd = attach(adir, rank)
        m = MemberProcess(rank, pid, pidfd, None)
        if pidfd is None:
            never_spawned |= not pid_file(adir, rank).exists()
            kill_group_leftovers(adir, rank)
            m.done = True
            m.code = recorded_exit(adir, rank)
        members.append(m)
    if never_spawned:
        stop_half_spawned(launch, members)
    return members


def stop_half_spawned(launch: Launch, members: list[MemberProcess]) -> None:
    alive = [m for m in members if not m.done]
    if alive:
        log.warning(
            "job %s attempt %d was only partly spawned; stopping its %d started member(s) so "
            "it is requeued as the next attempt",
            launch.job_id,
            launch.attempt,
            len(alive),
        )
    for m in alive:
        killpg(m.pid, signal.SIGKILL)
    reap_now(alive)
    for m in alive:
        kill_group_leftovers(launch.attempt_dir, m.rank)
        record_lost(launch.attempt_dir, m.rank, "killed at adoption: gang only partly spawned")
        m.done, m.code = True, None  # killed by us, not ended: the attempt is lost


def check_launch(launch: Launch) -> None:
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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _notice_path(launch: Launch) -> Path:
    return launch.attempt_dir / "notice"
