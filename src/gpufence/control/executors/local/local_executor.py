"""Local executor: runs job attempts as real processes on this machine.

Every gang member is one launcher (``launcher.py``) leading its own process group, forked by the
executor's fork server (``containment/forkserver.py``: ~1 ms instead of a fresh interpreter), so
the member's process tree is one process group that signals address as a unit. With containment
(``containment=``, what ``gpufence up`` passes unless ``--no-containment``) the job's processes are
also in the member's own cgroup, created here before the spawn and joined by the launcher's child
before it execs the job: signals and kills go to the cgroup, and the member is over (its GPUs free)
only when the cgroup is empty. The launcher records ``rank-R.pid`` / ``rank-R.exit`` in the
attempt's records directory (the control plane's, beside the job-owned attempt directory:
``jobdirs.py``); those records let a restarted control plane re-attach to attempts that kept
running (``adopt``, which re-opens their cgroups by name) or learn how they ended.

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
* when a member's main process (its launcher) has exited, whatever is left in its cgroup (or,
  without containment, its process group) is SIGKILLed at once and counted as strays, so
  nothing outlives the attempt on a GPU;
* ``stop`` and ``notice`` signal cgroups (or process groups), never single processes;
* a job with ``run_as`` gets its attempt and checkpoint directories (0700), its logs and notice
  (0600) owned by that user, and runs as it, in its ``cwd`` (entered as that user) or else its
  attempt directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from gpufence.control.base import failpoints
from gpufence.control.base.containers import (
    ContainerError,
    missing_runtime,
    runtime,
    sandbox_argv,
)
from gpufence.control.base.executor import (
    AckCallback,
    ExitCallback,
    Launch,
    LaunchError,
    Member,
    NodeCallback,
)
from gpufence.control.base.jobdirs import (
    NOTICE_FILE,
    owner_of,
    prepare_launch_dirs,
    working_dir,
)
from gpufence.control.base.member_records import (
    STOPS,
    atomic_write,
    err_file,
    out_file,
    pid_file,
    pid_record,
    pty_socket,
)
from gpufence.control.base.memberenv import member_envs
from gpufence.control.base.sifcache import ImageError, unpacked_root
from gpufence.control.containment.cgroup import ContainmentError, MemberCgroup
from gpufence.control.containment.forkserver import ForkServer, ForkServerError
from gpufence.control.containment.members import Containment, launcher_args
from gpufence.control.containment.spares import SparePool
from gpufence.control.executors.local.adoption import adopt_members, ready_attempt
from gpufence.control.executors.processes import (
    MemberProcess,
    group_cpu_by_pgid,
    killpg,
    launcher_argv,
    only_child,
    reap_now,
)
from gpufence.control.executors.watcher import (
    Attempt,
    AttemptWatcher,
    Key,
    empty_and_remove,
)

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
        containment: Containment | None = None,
    ) -> None:
        self.notice_signal = signal.Signals(notice_signal)
        self.records_tell_stops = self.notice_signal not in STOPS
        self.python = python
        self.containment = containment
        """None: members run unconfined (no cgroups): ``gpufence up --no-containment``."""
        # blocked while the launcher starts; it unblocks them once it can survive them
        self._caught = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, self.notice_signal}
        self._starting: set[Key] = set()
        self._forks = ForkServer(python)
        self._spares: SparePool | None = None
        if containment is not None:
            containment.sweep()  # spare cgroups of a control plane killed earlier
            if containment.driver.renames and containment.settings.prestarted > 0:
                self._spares = SparePool(containment, self._forks, containment.settings.prestarted)
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
            launch = unpacked_launch(launch, self._images_in_use())
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
            self._abandon(members)
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
            try:  # the job's user reads it; created without following links in its directory
                atomic_write(_notice_path(att.launch), body + "\n", owner_of(att.launch.run_as))
            except OSError as exc:
                log.error("job %s attempt %d: cannot write notice file: %s", job_id, attempt, exc)
            if signal_job:
                for m in att.live():
                    self._signal_locked(m, self.notice_signal)
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
                    self._signal_locked(m, signal.SIGTERM)
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
        members = adopt_members(launch, self.containment)
        att = Attempt(launch, members=members)
        alive = att.live()
        att.wall_base = time.monotonic()
        att.cpu_base = _cpu_seconds(members)
        with self._lock:
            if self._closing:
                for m in members:
                    if m.pidfd is not None:
                        os.close(m.pidfd)
                raise RuntimeError("the executor is closed")
            self._attempts[key] = att
            self._watch_locked(att)
            for m in members:  # launcher gone: what is left of the member goes too
                if m.done and m.cgroup is not None:
                    self._drain_start_locked(att, m, time.monotonic())
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
            groups = {key: list(att.members) for key, att in self._attempts.items()}
        cpus = {key: _cpu_seconds(members) for key, members in groups.items()}
        now = time.monotonic()
        out: dict[tuple[str, int], float] = {}
        with self._lock:
            for key, cpu in cpus.items():
                att = self._attempts.get(key)
                if att is None:
                    continue
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
                        self._kill_locked(m)
                        killpg(m.pid, signal.SIGKILL)
            self._wake_locked()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        if self._spares is not None:
            self._spares.close()
        self._forks.close()  # its launchers run on (kill=False) and are adopted next time
        if self.containment is not None:
            self.containment.release()

    def _images_in_use(self) -> set[Path]:
        """The unpacked images of this executor's running attempts (not to be evicted)."""
        with self._lock:
            return {a.launch.container for a in self._attempts.values() if a.launch.container}

    # ------------------------------------------------------------------ spawning
    def _spawn(self, launch: Launch) -> list[MemberProcess]:
        adir = launch.attempt_dir.absolute()
        run_as = launch.run_as
        # 0700, the job's user's; a new attempt directory gets its logs before it is handed over
        fresh = prepare_launch_dirs(launch)
        ranks = range(len(launch.members))
        # refused if it ran before; exit records reserved while the disk has room
        ready_attempt(adir, run_as, ranks, fresh)

        envs = member_envs(launch, "127.0.0.1", _free_port(), inherit=os.environ)
        started: list[MemberProcess] = []
        try:
            for member in sorted(launch.members, key=lambda m: m.rank):
                if started:
                    failpoints.hit("executor.between-spawns")
                started.append(self._spawn_member(launch, adir, member, envs[member.rank]))
        except BaseException:
            self._abandon(started)
            raise
        return started

    def _cgroup(self, launch: Launch, member: Member) -> MemberCgroup | None:
        if self.containment is None:
            return None
        try:
            return self.containment.create(launch, member)
        except ContainmentError as exc:
            raise LaunchError(f"job {launch.job_id} rank {member.rank}: {exc}") from exc

    def _spawn_member(
        self, launch: Launch, adir: Path, member: Member, env: dict[str, str]
    ) -> MemberProcess:
        """One member: in a pre-started one when the pool has one ready, else a new launcher
        (forked by the fork server) whose child joins a new cgroup. The member's cgroup is
        removed again if the spawn fails."""
        rank, run_as = member.rank, launch.run_as
        cwd = working_dir(launch)
        command, monitor = contained_command(launch, member, cwd)  # before anything is taken
        err, pidf = err_file(adir, rank), pid_file(adir, rank)
        ready = self._spares.take() if self._spares is not None else None
        if ready is not None:
            assert self.containment is not None and self._spares is not None
            try:
                cg: MemberCgroup | None = self.containment.claim(ready[0], launch, member)
            except ContainmentError as exc:
                log.warning(
                    "job %s rank %d: pre-started member unusable: %s", launch.job_id, rank, exc
                )
                self._spares.drop(*ready)
                ready = None
        if ready is None:
            cg = self._cgroup(launch, member)
        # a spare has joined its cgroup already, and its child is told its user and cwd itself
        confine = launcher_args(cg, run_as, cwd) if ready is None else []
        argv = launcher_argv(
            adir,
            rank,
            command,
            self._caught,
            [*confine, *monitor],
            log_limit=launch.limits.log_bytes,
            pty_grace=launch.pty_grace_s,
        )
        try:
            if ready is not None:
                child = {
                    "command": command,
                    "uid": run_as.uid if run_as is not None else None,
                    "gid": run_as.gid if run_as is not None else None,
                    "groups": list(run_as.groups) if run_as is not None else [],
                    "cwd": str(cwd),
                    "pty": _terminal(adir, launch.pty_grace_s),
                }
                logs = (out_file(adir, rank), err)
                spare = ready[1]
                generation = spare.generation
                pid = ForkServer.activate(spare, argv, env, logs, child)
                # the launcher writes it too, but maybe not before we return (a busy machine):
                # a crash then must still leave one, or the restart would take the member for
                # never spawned while its job runs (written after the activation: the job's
                # start does not wait for it)
                with contextlib.suppress(OSError):  # a full disk: the launcher tries too
                    atomic_write(pidf, pid_record(spare.pid, spare.start_time))
            else:
                pid, generation = self._forks.spawn(argv, env, err, pidf)
        except ForkServerError as exc:
            if cg is not None:
                empty_and_remove([cg])
            raise LaunchError(f"job {launch.job_id}: cannot start rank {rank}: {exc}") from exc
        m = MemberProcess(rank, pid, None, None, cgroup=cg, forked=generation)
        # a pre-started member's launcher is there already, below its supervisor (``pid``, the
        # group's leader): watching it, not the supervisor, keeps the supervisor's exit off
        # the GPU hand-off (the supervisor is watched only if the launcher dies first)
        watch = (only_child(pid) if ready is not None else None) or pid
        try:
            m.pidfd = os.pidfd_open(watch)
        except OSError as exc:
            self._abandon([m])
            raise LaunchError(f"job {launch.job_id}: pidfd_open failed for rank {rank}") from exc
        if ready is not None and cg is not None and self._spares is not None:
            self._spares.finish_later(cg)  # the job runs: the rest of the claim can wait
        return m

    def _reap_launcher(self, m: MemberProcess) -> int | None:
        return self._forks.reap(m.pid, m.forked) if m.forked else None

    def _abandon(self, members: list[MemberProcess]) -> None:
        """Kill members that must not run after all (a failed or interrupted start)."""
        groups = [m.cgroup for m in members if m.cgroup is not None]
        for cg in groups:
            with contextlib.suppress(ContainmentError):
                cg.kill()
        for m in members:
            killpg(m.pid, signal.SIGKILL)
        reap_now(members)
        for m in members:
            if m.forked:
                self._forks.reap(m.pid, m.forked)
        empty_and_remove(groups)


# ---------------------------------------------------------------------- helpers
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


def unpacked_launch(launch: Launch, in_use: set[Path]) -> Launch:
    """``launch`` with a ``.sif`` container replaced by its unpacked tree (``sifcache``), made
    as the job's user; any other launch as it is."""
    image = launch.container
    if image is None or image.suffix != ".sif":
        return launch
    where = f"job {launch.job_id} attempt {launch.attempt}"
    if launch.image_cache is None:
        raise LaunchError(f"{where}: a .sif image needs an image cache directory")
    try:
        tree = unpacked_root(image, launch.run_as, launch.image_cache, in_use)
    except (ImageError, OSError) as exc:
        raise LaunchError(f"{where}: {exc}") from exc
    return dataclasses.replace(launch, container=tree)


def contained_command(launch: Launch, member: Member, cwd: Path) -> tuple[list[str], list[str]]:
    """(the command to start, launcher options for it): with ``launch.container``, the job's
    command inside its sandbox (``containers.sandbox_argv``), whose monitor the launcher sees
    past (``--runtime-monitor``); else the job's command as it is."""
    if launch.container is None:
        return list(launch.command), []
    where = f"job {launch.job_id} rank {member.rank}"
    bwrap = runtime()
    if bwrap is None:
        raise LaunchError(f"{where}: {missing_runtime()}")
    binds = [launch.attempt_dir, launch.checkpoint_dir, cwd]
    if member.share is not None and member.share.mps_pipe_dir is not None:
        binds.append(Path(member.share.mps_pipe_dir))
    try:
        sandbox = sandbox_argv(launch.container, binds, member.device_nodes, cwd, bwrap)
    except ContainerError as exc:
        raise LaunchError(f"{where}: {exc}") from exc
    return [*sandbox, *launch.command], ["--runtime-monitor", "1"]


def _cpu_seconds(members: list[MemberProcess]) -> float:
    """CPU seconds of members: their cgroups', else their process groups' (live processes)."""
    per_group = group_cpu_by_pgid({m.pid for m in members if m.cgroup is None and m.pid > 1})
    total = sum(per_group.values())
    for m in members:
        if m.cgroup is not None:
            total += m.cgroup.cpu_seconds()
    return total


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _notice_path(launch: Launch) -> Path:
    return launch.attempt_dir / NOTICE_FILE


def _terminal(adir: Path, grace: float | None) -> list[str | float] | None:
    """A pre-started member's ``pty`` (its child is then the job's terminal host: the
    launcher's ``--pty-grace``): [socket, grace], or None for a job without a terminal."""
    return None if grace is None else [str(pty_socket(adir)), grace]
