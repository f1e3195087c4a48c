"""The per-node agent of the Ray executor: a Ray actor that runs gang members on its node.

``RayExecutor`` (``ray_executor.py``) starts one agent per Ray node it uses, pinned to that node
(``NodeAffinitySchedulingStrategy(node_id, soft=False)``, ``num_cpus=0``, ``num_gpus=0``: Ray
neither chooses the node nor sets ``CUDA_VISIBLE_DEVICES``), as a named detached actor
(``gpufence-agent-<node id>`` in namespace ``gpufence``), so it outlives a control-plane restart
and the next control plane re-attaches to it.

The agent does on its node what ``LocalExecutor`` does on one machine: each member is one
``launcher.py`` in a new session (its whole process tree is one process group), the launcher records
``rank-R.pid`` / ``.started`` / ``.exit`` in the attempt's records directory, signals go to process
groups, the ack file is looked for here. With containment (``nodecontain.py``) each member runs in
its own cgroup on this node, with its limits, device rules and user: signals and kills go to the
cgroup, and a member is over (``run`` returns) only once its cgroup is empty, the strays of its main
process killed and counted. ``run()`` returns the member's exit code when it ends (the executor
``ray.wait``s on those refs); exits are seen through pidfds on the actor's event loop, so nothing
polls.

One agent per node rather than one actor per member: a Ray actor is a Python worker process of
its own (0.4 s to start on an idle 2-core machine, 1.6 s for four at once), which would sit in the
start latency of every job; the agent's calls cost ~1 ms. The class is plain Python: the executor
wraps it with ``ray.remote`` (this module does not import ``ray`` at import time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufence.control.base.containment_settings import ContainmentSettings
from gpufence.control.base.executor import Launch, LaunchError, RunAs
from gpufence.control.base.jobdirs import (
    ACK_FILE,
    NOTICE_FILE,
    owner_of,
    prepare_job_dirs,
    reset_attempt,
)
from gpufence.control.base.member_records import atomic_write, exit_file, reserved_exit_record
from gpufence.control.base.memberenv import inherited_env
from gpufence.control.base.record_reads import recorded_exit, recorded_stop
from gpufence.control.containment.cgroup import ContainmentError, MemberCgroup
from gpufence.control.containment.members import launcher_args
from gpufence.control.executors.processes import (
    MemberProcess,
    SpawnError,
    attach,
    group_cpu_by_pgid,
    killpg,
    settle,
    spawn_member,
    waitid,
)
from gpufence.control.executors.ray.nodecontain import NodeContainment

ACK_POLL_S = 0.02
"""How often ``wait_ack`` looks for the ack file."""


DRAIN_POLL_S = 0.002
DRAIN_LIMIT_S = 10.0
"""A cgroup still not empty this long after its member ended is reported anyway (logged)."""


@dataclass(eq=False)
class _Member:
    proc: MemberProcess
    done: asyncio.Event = field(default_factory=asyncio.Event)
    owner: tuple[int, int] | None = None
    """(uid, gid) of the job's user, who must be able to read the notice file."""

    def outcome(self) -> dict[str, Any]:
        p = self.proc
        return {"code": p.code, "oom": p.oom, "strays": p.strays}


def member_key(attempt_dir: str, rank: int) -> str:
    return f"{attempt_dir}#{rank}"


class NodeAgent:
    """Runs gang members on this Ray node (see the module docstring). Every method is a coroutine:
    Ray runs them on the actor's event loop, many at once (``run`` waits while others signal)."""

    def __init__(self) -> None:
        self._members: dict[str, _Member] = {}
        self._contain = NodeContainment()

    # ------------------------------------------------------------------ about this node
    async def info(self) -> dict[str, Any]:
        """Where this agent runs: Ray node id and IP, host name, agent pid."""
        import ray  # the agent only ever runs inside a Ray worker

        ctx = ray.get_runtime_context()
        return {
            "node_id": str(ctx.get_node_id()),
            "ip": str(ray.util.get_node_ip_address()),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
        }

    async def free_port(self) -> int:
        """A TCP port free on this node now (rank 0's node: ``MASTER_PORT``)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port: int = s.getsockname()[1]
            return port

    # ------------------------------------------------------------------ members
    async def start(
        self,
        attempt_dir: str,
        rank: int,
        command: list[str],
        env: dict[str, str],
        cwd: str | None,
        catch: list[int],
        launch: Launch | None = None,
        contain: ContainmentSettings | None = None,
        gpu_nodes: tuple[str, ...] = (),
    ) -> int:
        """Start one member through the launcher; its pid (raises ``RuntimeError`` on failure).
        ``launch`` gives its user and limits; with ``contain`` it runs in its own cgroup (device
        rules over ``gpu_nodes``, this node's GPU device nodes; NVML's where empty)."""
        key = member_key(attempt_dir, rank)
        adir = Path(attempt_dir)
        run_as = launch.run_as if launch is not None else None
        if key in self._members and not self._members[key].done.is_set():
            raise RuntimeError(f"{adir} rank {rank} is already running on this node")
        ckdir = launch.checkpoint_dir.absolute() if launch is not None else None
        if ckdir is None and env.get("GPUFENCE_CHECKPOINT_DIR"):
            ckdir = Path(env["GPUFENCE_CHECKPOINT_DIR"])
        try:
            # 0700, the job's user's; a new attempt directory gets its logs before it is handed
            # over (another rank of the attempt on this node may have made it already)
            fresh = prepare_job_dirs(adir, ckdir or adir.parent / "checkpoints", run_as, [rank])
        except LaunchError as exc:
            raise RuntimeError(f"on this node: {exc}") from exc
        if not fresh:
            pid, pidfd = attach(adir, rank)
            if pidfd is not None:
                os.close(pidfd)
                raise RuntimeError(f"{adir} already has a live rank {rank} (pid {pid})")
            try:  # its old records and logs (links unfollowed); the notice and ack too
                reset_attempt(adir, run_as, [rank])
            except LaunchError as exc:
                raise RuntimeError(f"on this node: {exc}") from exc
        try:  # reserved while the disk has room: a full one must not cost the exit record
            atomic_write(exit_file(adir, rank), reserved_exit_record())
        except OSError as exc:
            raise RuntimeError(f"on this node: cannot prepare {adir}: {exc}") from exc
        if cwd is not None and not Path(cwd).is_dir():
            raise RuntimeError(f"working directory {cwd} does not exist on this node")
        workdir = cwd if cwd is not None else str(adir)  # as jobdirs.working_dir
        full_env = inherited_env(os.environ)  # the allow-list only: no secret of this node's
        full_env.update(env)
        full_env["GPUFENCE_RAY_NODE_ID"] = await self._node_id()
        caught = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, *map(signal.Signals, catch)}
        cg = None
        if contain is not None and launch is not None:
            cg = self._contain.create(contain, gpu_nodes, launch, rank)
        try:
            proc = spawn_member(
                sys.executable,
                adir,
                rank,
                command,
                full_env,
                caught,
                fence_parent=True,
                confine=launcher_args(cg, run_as, workdir),
                log_limit=launch.limits.log_bytes if launch is not None else None,
            )
        except SpawnError as exc:
            if cg is not None:
                cg.remove()
            raise RuntimeError(str(exc)) from exc
        proc.cgroup = cg
        self._watch(key, adir, proc, run_as)
        return proc.pid

    async def adopt(
        self,
        attempt_dir: str,
        rank: int,
        launch: Launch | None = None,
        contain: ContainmentSettings | None = None,
    ) -> tuple[bool, int | None]:
        """(True, None) if the member runs (known here, or re-found from its pid record after an
        agent restart, with its cgroup); else (False, its recorded exit code or None), whatever
        was left in its cgroup killed."""
        key = member_key(attempt_dir, rank)
        m = self._members.get(key)
        if m is not None:
            return (not m.done.is_set(), m.proc.code)
        adir = Path(attempt_dir)
        cg = None
        if contain is not None and launch is not None:
            cg = self._contain.open(contain, launch, rank)
        pid, pidfd = attach(adir, rank)
        if pidfd is None:
            if cg is not None:
                await _drain(cg)
                cg.remove()
            return (False, recorded_exit(adir, rank))
        proc = MemberProcess(rank, pid, pidfd, None)
        proc.cgroup = cg
        self._watch(key, adir, proc, launch.run_as if launch is not None else None)
        return (True, None)

    async def run(self, attempt_dir: str, rank: int) -> dict[str, Any]:
        """Wait for the member to be over (with a cgroup: until it is empty); its outcome:
        ``code`` (negative = signal; None = unknown), ``oom``, ``strays`` (killed), ``stop``
        (a stop reached it before its command exited; None = unknown)."""
        m = self._members.get(member_key(attempt_dir, rank))
        if m is None:
            out = {"code": recorded_exit(Path(attempt_dir), rank), "oom": False, "strays": 0}
        else:
            await m.done.wait()
            out = m.outcome()
        # what its launcher recorded of a stop (``AttemptExit.stop_reached``): it is on this node
        out["stop"] = recorded_stop(Path(attempt_dir), rank)
        return out

    async def signal(self, attempt_dir: str, ranks: list[int], signum: int) -> None:
        """Send ``signum`` to these members (those still running): their cgroups (SIGKILL:
        killed; else every process, plus the launcher, which passes on an early one), or their
        process groups."""
        sig = signal.Signals(signum)
        for rank in ranks:
            m = self._members.get(member_key(attempt_dir, rank))
            if m is None or m.done.is_set():
                continue
            cg = m.proc.cgroup
            if cg is None:
                killpg(m.proc.pid, sig)
                continue
            with contextlib.suppress(ContainmentError):
                if sig == signal.SIGKILL:
                    cg.kill()
                else:  # the launcher first: it records whether a stop reached the member
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(m.proc.pid, sig)
                    cg.signal(sig)

    async def notice(
        self, attempt_dir: str, ranks: list[int], body: str, signum: int | None
    ) -> None:
        """Write the notice file (on this node, the job's user's: it must read it; never through a
        link in its directory) and, with ``signum``, signal the members."""
        known = [self._members.get(member_key(attempt_dir, r)) for r in ranks]
        owner = next((m.owner for m in known if m is not None), None)
        with contextlib.suppress(OSError):
            atomic_write(Path(attempt_dir) / NOTICE_FILE, body, owner)
        if signum is not None:
            await self.signal(attempt_dir, ranks, signum)

    async def wait_ack(self, attempt_dir: str, ranks: list[int], limit_s: float) -> bool:
        """True once the attempt's ack file exists here; False when these members have all ended
        or ``limit_s`` passed first."""
        path = Path(attempt_dir) / ACK_FILE
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            if path.exists():
                return True
            members = [self._members.get(member_key(attempt_dir, r)) for r in ranks]
            if all(m is None or m.done.is_set() for m in members):
                return path.exists()
            await asyncio.sleep(ACK_POLL_S)
        return False

    async def forget(self, attempt_dir: str, ranks: list[int]) -> None:
        """Drop what is kept about members whose end was reported."""
        for rank in ranks:
            key = member_key(attempt_dir, rank)
            m = self._members.get(key)
            if m is not None and m.done.is_set():
                del self._members[key]

    async def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used so far by each running member's cgroup or process group (idle
        detection)."""
        running = {k: m.proc for k, m in self._members.items() if not m.done.is_set()}
        per_group = group_cpu_by_pgid({p.pid for p in running.values() if p.cgroup is None})
        return {
            k: p.cgroup.cpu_seconds() if p.cgroup is not None else per_group.get(p.pid, 0.0)
            for k, p in running.items()
        }

    async def running(self) -> list[str]:
        return [k for k, m in self._members.items() if not m.done.is_set()]

    # ------------------------------------------------------------------ internals
    async def _node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def _watch(
        self, key: str, adir: Path, proc: MemberProcess, run_as: RunAs | None = None
    ) -> None:
        m = _Member(proc, owner=owner_of(run_as))
        self._members[key] = m
        assert proc.pidfd is not None
        loop = asyncio.get_running_loop()
        loop.add_reader(proc.pidfd, self._exited, loop, m, adir)

    def _exited(self, loop: asyncio.AbstractEventLoop, m: _Member, adir: Path) -> None:
        proc = m.proc
        if proc.pidfd is None:
            return
        loop.remove_reader(proc.pidfd)
        # leftovers of the group die with the member, signalled while the zombie pins the id
        if proc.cgroup is None:
            killpg(proc.pid, signal.SIGKILL)
        status = waitid(proc.pidfd)
        os.close(proc.pidfd)
        proc.pidfd = None
        recorded = recorded_exit(adir, proc.rank)
        settle(proc, recorded if recorded is not None else status)
        if proc.cgroup is None:
            m.done.set()
        else:  # over once its cgroup is empty
            loop.create_task(self._drained(m, proc.cgroup))

    async def _drained(self, m: _Member, cg: MemberCgroup) -> None:
        m.proc.strays = await _drain(cg)
        m.proc.oom = cg.oom_kills() > 0
        m.proc.drained = True
        cg.remove()
        m.done.set()


async def _drain(cg: MemberCgroup) -> int:
    """Kill what is left in ``cg`` and wait (bounded) until it is empty; how many were killed."""
    try:
        n = cg.kill()
    except ContainmentError:
        n = len(cg.pids())
    end = time.monotonic() + DRAIN_LIMIT_S
    while not cg.empty():
        if time.monotonic() > end:
            logging.getLogger("gpufence.executor.ray").error(
                "cgroup %s still holds pids %s after the kill", cg.name, cg.pids()[:10]
            )
            break
        await asyncio.sleep(DRAIN_POLL_S)
        with contextlib.suppress(ContainmentError):
            cg.kill()
    return n
