"""The per-node agent of the Ray executor: a Ray actor that runs gang members on its node.

``RayExecutor`` (``ray_executor.py``) starts one agent per Ray node it uses, pinned to that node
(``NodeAffinitySchedulingStrategy(node_id, soft=False)``, ``num_cpus=0``, ``num_gpus=0``: Ray
neither chooses the node nor sets ``CUDA_VISIBLE_DEVICES``), as a named detached actor
(``gpufence-agent-<node id>`` in namespace ``gpufence``), so it outlives a control-plane restart
and the next control plane re-attaches to it.

The agent does on its node what ``LocalExecutor`` does on one machine: each member is one
``launcher.py`` in a new session (its whole process tree is one process group), the launcher
records ``rank-R.pid`` / ``.started`` / ``.exit`` in the attempt directory, signals go to process
groups, the ack file is looked for here. ``run()`` returns the member's exit code when it ends
(the executor ``ray.wait``s on those refs); exits are seen through pidfds on the actor's event
loop, so nothing polls.

One agent per node rather than one actor per member: a Ray actor is a Python worker process of
its own (0.4 s to start on an idle 2-core machine, 1.6 s for four at once), which would sit in the
start latency of every job; the agent's calls cost ~1 ms. The class is plain Python: the executor
wraps it with ``ray.remote`` (this module does not import ``ray`` at import time).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufence.control.executors.launcher import (
    atomic_write,
    err_file,
    exit_file,
    out_file,
    pid_file,
)
from gpufence.control.executors.memberenv import inherited_env
from gpufence.control.executors.processes import (
    MemberProcess,
    SpawnError,
    attach,
    group_cpu_by_pgid,
    killpg,
    recorded_exit,
    settle,
    spawn_member,
    waitid,
)

ACK_POLL_S = 0.02
"""How often ``wait_ack`` looks for the ack file."""


@dataclass(eq=False)
class _Member:
    proc: MemberProcess
    done: asyncio.Event = field(default_factory=asyncio.Event)


def member_key(attempt_dir: str, rank: int) -> str:
    return f"{attempt_dir}#{rank}"


class NodeAgent:
    """Runs gang members on this Ray node (see the module docstring). Every method is a coroutine:
    Ray runs them on the actor's event loop, many at once (``run`` waits while others signal)."""

    def __init__(self) -> None:
        self._members: dict[str, _Member] = {}

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
    ) -> int:
        """Start one member through the launcher; its pid (raises ``RuntimeError`` on failure)."""
        key = member_key(attempt_dir, rank)
        adir = Path(attempt_dir)
        if key in self._members and not self._members[key].done.is_set():
            raise RuntimeError(f"{adir} rank {rank} is already running on this node")
        try:
            adir.mkdir(parents=True, exist_ok=True)
            if env.get("GPUFENCE_CHECKPOINT_DIR"):
                Path(env["GPUFENCE_CHECKPOINT_DIR"]).mkdir(parents=True, exist_ok=True)
            pid, pidfd = attach(adir, rank)
            if pidfd is not None:
                os.close(pidfd)
                raise RuntimeError(f"{adir} already has a live rank {rank} (pid {pid})")
            if rank == 0:
                for name in ("notice", "ack"):
                    (adir / name).unlink(missing_ok=True)
            pid_file(adir, rank).unlink(missing_ok=True)
            exit_file(adir, rank).unlink(missing_ok=True)
            out_file(adir, rank).write_bytes(b"")
            err_file(adir, rank).write_bytes(b"")
        except OSError as exc:
            raise RuntimeError(f"cannot prepare {adir} on this node: {exc}") from exc
        if cwd is not None and not Path(cwd).is_dir():
            raise RuntimeError(f"working directory {cwd} does not exist on this node")
        full_env = inherited_env(os.environ)  # the allow-list only: no secret of this node's
        full_env.update(env)
        full_env["GPUFENCE_RAY_NODE_ID"] = await self._node_id()
        caught = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, *map(signal.Signals, catch)}
        try:
            proc = spawn_member(
                sys.executable, adir, rank, command, full_env, cwd, caught, fence_parent=True
            )
        except SpawnError as exc:
            raise RuntimeError(str(exc)) from exc
        self._watch(key, adir, proc)
        return proc.pid

    async def adopt(self, attempt_dir: str, rank: int) -> tuple[bool, int | None]:
        """(True, None) if the member runs (known here, or re-found from its pid record after an
        agent restart); else (False, its recorded exit code or None)."""
        key = member_key(attempt_dir, rank)
        m = self._members.get(key)
        if m is not None:
            return (not m.done.is_set(), m.proc.code)
        adir = Path(attempt_dir)
        pid, pidfd = attach(adir, rank)
        if pidfd is None:
            return (False, recorded_exit(adir, rank))
        self._watch(key, adir, MemberProcess(rank, pid, pidfd, None))
        return (True, None)

    async def run(self, attempt_dir: str, rank: int) -> int | None:
        """Wait for the member to end; its exit code (negative = signal; None = unknown)."""
        m = self._members.get(member_key(attempt_dir, rank))
        if m is None:
            return recorded_exit(Path(attempt_dir), rank)
        await m.done.wait()
        return m.proc.code

    async def signal(self, attempt_dir: str, ranks: list[int], signum: int) -> None:
        """Send ``signum`` to the process groups of these members (those still running)."""
        for rank in ranks:
            m = self._members.get(member_key(attempt_dir, rank))
            if m is not None and not m.done.is_set():
                killpg(m.proc.pid, signal.Signals(signum))

    async def notice(
        self, attempt_dir: str, ranks: list[int], body: str, signum: int | None
    ) -> None:
        """Write the notice file (on this node) and, with ``signum``, signal the members."""
        with contextlib.suppress(OSError):
            atomic_write(Path(attempt_dir) / "notice", body)
        if signum is not None:
            await self.signal(attempt_dir, ranks, signum)

    async def wait_ack(self, attempt_dir: str, ranks: list[int], limit_s: float) -> bool:
        """True once the attempt's ack file exists here; False when these members have all ended
        or ``limit_s`` passed first."""
        path = Path(attempt_dir) / "ack"
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
        """CPU seconds used so far by each running member's process group (idle detection)."""
        running = {k: m.proc.pid for k, m in self._members.items() if not m.done.is_set()}
        per_group = group_cpu_by_pgid(set(running.values()))
        return {k: per_group.get(pid, 0.0) for k, pid in running.items()}

    async def running(self) -> list[str]:
        return [k for k, m in self._members.items() if not m.done.is_set()]

    # ------------------------------------------------------------------ internals
    async def _node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def _watch(self, key: str, adir: Path, proc: MemberProcess) -> None:
        m = _Member(proc)
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
        killpg(proc.pid, signal.SIGKILL)
        status = waitid(proc.pidfd)
        os.close(proc.pidfd)
        proc.pidfd = None
        recorded = recorded_exit(adir, proc.rank)
        settle(proc, recorded if recorded is not None else status)
        m.done.set()
