"""Ray executor: runs each gang member on the Ray node the scheduler chose.

gpufence keeps every scheduling decision; Ray only runs processes where gpufence said. Each
member is started by the node agent of its Ray node (``agent.NodeAgent``: a detached actor
pinned with ``NodeAffinitySchedulingStrategy(node_id, soft=False)``, ``num_cpus=0``,
``num_gpus=0``) through ``launcher.py``, in its own process group, with ``CUDA_VISIBLE_DEVICES``
= the GPU indices / MIG UUIDs the scheduler chose, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` = the IP of rank 0's node and ``MASTER_PORT`` = a port free there.

Threads: a watcher ``ray.wait``s on the members' ``run()`` refs (and on ``wait_ack`` refs of
noticed attempts) and reports each attempt's exit once, through ``on_exit``, never while the
lock is held; a health thread (``health.py``) polls ``ray.nodes()`` every ``health_poll_s``
and reports node down / up through ``on_node``.

Policy, as in ``LocalExecutor``: a gang is all-or-nothing (a member ending non-zero gets the rest
SIGTERM, then SIGKILL ``gang_grace_s`` later); ``stop`` is SIGTERM, grace, SIGKILL to process
groups. A member whose node went down (or whose agent died) ends with code None; its surviving
gang members are left to the scheduler, which stops the jobs of a failed node (reason
node-failure, requeued): the attempt's exit is reported once ``stop`` was called and the survivors
ended, so it is settled as stopped, never as failed. If no stop comes within ``lost_hold_s`` (the
node looked alive: an agent crash), the gang is aborted as for any failed member. Members on a
node declared down are also sent SIGKILL through its agent, in case it is still reachable, so a
requeued job never runs twice.

Attempt directories: the agents write the launcher's records, logs, notice and ack files under
the same ``DATA/jobs/...`` path on their node; on one machine or with a shared file system the
control plane reads them as with the local executor.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from gpufence.control.base.containment_settings import ContainmentSettings
from gpufence.control.base.executor import (
    AckCallback,
    AttemptExit,
    ExitCallback,
    Launch,
    LaunchError,
    NodeCallback,
    report,
)
from gpufence.control.base.member_records import STOPS
from gpufence.control.base.memberenv import member_envs
from gpufence.control.base.record_reads import combined_stop, recorded_exit
from gpufence.control.executors.local.local_executor import check_launch
from gpufence.control.executors.ray.agent import NodeAgent
from gpufence.control.executors.ray.bookkeeping import (
    Key,
    RayAttempt,
    RayMember,
    by_agent,
    short,
    where,
)
from gpufence.control.executors.ray.health import NodeHealth
from gpufence.control.executors.ray.nodecontain import member_nodes, template_nodes
from gpufence.control.executors.ray.nodes import RayNode

log = logging.getLogger("gpufence.executor.ray")

NAMESPACE = "gpufence"
GANG_GRACE_S = 5.0
LOST_HOLD_S = 10.0
"""How long the exit of an attempt with a lost member waits for the scheduler's stop."""
CALL_TIMEOUT_S = 60.0
WAIT_CAP_S = 0.05
"""Longest single ``ray.wait``: refs added meanwhile are watched after at most this long."""
ACK_WAIT_S = 30.0
ACTIVITY_TIMEOUT_S = 1.0  # how long idle detection waits for a node agent's CPU sample

_Agent = ray.remote(NodeAgent)


def _ignore(*_args: Any) -> None:
    log.warning("ray executor: an event arrived before its callback was set")


class RayExecutor(NodeHealth):
    """See the module docstring. ``nodes``: gpufence node name -> Ray node (``nodes.RayNode``)."""

    def __init__(
        self,
        nodes: Mapping[str, RayNode],
        notice_signal: signal.Signals = signal.SIGUSR1,
        *,
        gang_grace_s: float = GANG_GRACE_S,
        lost_hold_s: float = LOST_HOLD_S,
        health_poll_s: float = 0.5,
        owns_ray: bool = False,
        containment: ContainmentSettings | None = None,
    ) -> None:
        if not ray.is_initialized():
            raise RuntimeError("RayExecutor needs ray.init() first")
        self.notice_signal = signal.Signals(notice_signal)
        # a notice sent as SIGTERM/SIGINT looks like a stop to the launchers: their records
        # then tell nothing (stop_reached None: the executor's own "asked" decides)
        self._records_tell_stops = self.notice_signal not in STOPS
        self.gang_grace_s = gang_grace_s
        self.lost_hold_s = lost_hold_s
        self.health_poll_s = health_poll_s
        self._owns_ray = owns_ray
        self.containment = containment
        """None: members run unconfined; else each node's agent contains them (its own mode)."""
        self._lock = threading.Lock()
        self._nodes = dict(nodes)
        self._up = dict.fromkeys(self._nodes, True)
        self._agents: dict[str, Any] = {}
        self._attempts: dict[Key, RayAttempt] = {}
        self._cpu_base: dict[Key, tuple[float, float]] = {}  # CPU seconds, monotonic time
        self._refs: dict[Any, tuple[RayAttempt, RayMember]] = {}
        self._ack_refs: dict[Any, RayAttempt] = {}
        self._on_exit: ExitCallback = _ignore
        self._on_ack: AckCallback = _ignore
        self._on_node: NodeCallback = _ignore
        self._closing = threading.Event()
        self._wake = threading.Event()
        self._poll_now = threading.Event()
        self._check_agents()
        self._watcher = threading.Thread(target=self._watch, name="gpufence-ray-exits", daemon=True)
        self._health = threading.Thread(target=self._poll, name="gpufence-ray-health", daemon=True)
        self._watcher.start()
        self._health.start()

    # ------------------------------------------------------------------ agents
    def _agent(self, node: RayNode) -> Any:
        handle = self._agents.get(node.node_id)
        if handle is None:
            handle = _Agent.options(
                name=f"gpufence-agent-{node.node_id}",
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                num_gpus=0,
                max_concurrency=1000,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
            ).remote()
            self._agents[node.node_id] = handle
        return handle

    def _check_agents(self) -> None:
        """Start (or find) every node's agent now, so no job waits for one, and check that
        each runs where it was pinned."""
        with self._lock:
            pairs = [(n, self._agent(n)) for n in self._nodes.values()]
        infos = ray.get([a.info.remote() for _n, a in pairs], timeout=CALL_TIMEOUT_S)
        for (node, _a), info in zip(pairs, infos, strict=True):
            if info["node_id"] != node.node_id:
                raise RuntimeError(f"agent for Ray node {node.node_id} runs on {info['node_id']}")

    # ------------------------------------------------------------------ Executor API
    def set_callbacks(self, on_exit: ExitCallback, on_ack: AckCallback) -> None:
        with self._lock:
            self._on_exit, self._on_ack = on_exit, on_ack

    def set_node_callback(self, on_node: NodeCallback) -> None:
        with self._lock:
            self._on_node = on_node

    def node_ids(self) -> dict[str, str]:
        """gpufence node name -> the Ray node id it is now."""
        with self._lock:
            return {name: n.node_id for name, n in self._nodes.items()}

    def start(self, launch: Launch) -> None:
        check_launch(launch)
        if launch.container is not None:  # refused at submit; a stored one must not run bare
            raise LaunchError(f"job {launch.job_id}: --container runs with the local executor only")
        key = (launch.job_id, launch.attempt)
        members = sorted(launch.members, key=lambda m: m.rank)
        with self._lock:
            if self._closing.is_set():
                raise LaunchError("the executor is closed")
            if key in self._attempts:
                raise LaunchError(f"attempt {launch.attempt} of job {launch.job_id} is running")
            placed: list[tuple[RayNode, Any]] = []
            for m in members:
                node = self._nodes.get(m.node)
                if node is None or not self._up.get(m.node, False):
                    raise LaunchError(f"node {m.node} is not an alive Ray node")
                placed.append((node, self._agent(node)))
        adir = str(launch.attempt_dir.absolute())
        cwd = str(launch.cwd) if launch.cwd is not None else None
        contain = self.containment
        try:
            port = ray.get(placed[0][1].free_port.remote(), timeout=CALL_TIMEOUT_S)
            envs = member_envs(launch, placed[0][0].ip, int(port))
            launch = self._with_device_nodes(launch)
            refs = [
                agent.start.remote(
                    adir,
                    m.rank,
                    list(launch.command),
                    envs[m.rank],
                    cwd,
                    [self.notice_signal],
                    launch,
                    contain,
                    template_nodes(contain, node.gpus) if contain is not None else (),
                )
                for m, (node, agent) in zip(members, placed, strict=True)
            ]
            pids = ray.get(refs, timeout=CALL_TIMEOUT_S)
        except Exception as exc:
            for m, (_node, agent) in zip(members, placed, strict=True):
                agent.signal.remote(adir, [m.rank], int(signal.SIGKILL))
            raise LaunchError(f"cannot start job {launch.job_id}: {short(exc)}") from exc
        pairs = zip(members, placed, strict=True)
        att = RayAttempt(
            launch, members=[RayMember(m.rank, m.node, n.node_id, a) for m, (n, a) in pairs]
        )
        with self._lock:
            self._attempts[key] = att
            for rm in att.members:
                self._refs[rm.agent.run.remote(adir, rm.rank)] = (att, rm)
        self._wake.set()
        log.info("started job %s attempt %d on %s, pids %s", *key, where(att), pids)

    def _with_device_nodes(self, launch: Launch) -> Launch:
        """Fake GPUs: each member's device nodes from the template (real GPUs: the agent asks
        NVML on its node)."""
        contain = self.containment
        if contain is None or contain.fake_gpu_devices is None:
            return launch
        members = tuple(
            replace(m, device_nodes=member_nodes(contain, m.devices)) for m in launch.members
        )
        return replace(launch, members=members)

    def notice(
        self, job_id: str, attempt: int, reason: str, deadline_unix: float, signal_job: bool = True
    ) -> None:
        body = json.dumps({"reason": reason, "deadline_unix": deadline_unix}) + "\n"
        signum = int(self.notice_signal) if signal_job else None
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                log.warning("notice for job %s attempt %d, which is not running", job_id, attempt)
                return
            adir = str(att.launch.attempt_dir.absolute())
            for agent, ranks in by_agent(att.live()).values():
                agent.notice.remote(adir, ranks, body, signum)
            if not att.acked and not att.ack_wanted:
                att.ack_wanted = True
                self._arm_ack_locked(att)
        self._wake.set()

    def stop(self, job_id: str, attempt: int, grace_s: float) -> None:
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                return
            first = att.request_stop(time.monotonic() + max(0.0, grace_s))
            if first:
                self._signal_locked(att, signal.SIGTERM)
        self._wake.set()
        if first:
            log.info("stopping job %s attempt %d (grace %.1fs)", job_id, attempt, grace_s)

    def adopt(self, launch: Launch) -> bool:
        key = (launch.job_id, launch.attempt)
        adir = str(launch.attempt_dir.absolute())
        with self._lock:
            if self._closing.is_set():
                raise RuntimeError("the executor is closed")
            if key in self._attempts:
                return True
            where = {m.rank: self._nodes.get(m.node) for m in launch.members}
            up = {m.rank: self._up.get(m.node, False) for m in launch.members}
            agents = {r: self._agent(n) for r, n in where.items() if n is not None and up[r]}
        found: dict[int, tuple[bool, int | None]] = {}
        for rank, agent in agents.items():
            try:
                ref = agent.adopt.remote(adir, rank, launch, self.containment)
                alive, code = ray.get(ref, timeout=CALL_TIMEOUT_S)
                found[rank] = (bool(alive), code)
            except Exception as exc:
                log.warning("job %s rank %d: its agent did not answer: %s", key[0], rank, exc)
        members: list[RayMember] = []
        for m in sorted(launch.members, key=lambda m: m.rank):
            node = where[m.rank]
            agent = agents.get(m.rank)
            alive, code = found.get(m.rank, (False, None))
            if not alive and code is None:  # same machine or a shared file system
                code = recorded_exit(launch.attempt_dir, m.rank)
            member = RayMember(m.rank, m.node, node.node_id if node else "", agent)
            member.done, member.code = not alive, code
            members.append(member)
        att = RayAttempt(launch, members=members)
        live = att.live()
        with self._lock:
            self._attempts[key] = att
            for rm in live:
                self._refs[rm.agent.run.remote(adir, rm.rank)] = (att, rm)
            failed = [rm for rm in members if rm.done and rm.code != 0]
            if failed and live:
                self._gang_abort_locked(att, failed[0])
        self._wake.set()
        log.info("adopted job %s attempt %d: %d of %d alive", *key, len(live), len(members))
        return bool(live)

    def running(self) -> list[tuple[str, int]]:
        with self._lock:
            return list(self._attempts)

    def activity(self) -> dict[tuple[str, int], float]:
        """CPU utilisation per running attempt since the last call, from each node's agent
        (the CPU time of the members' process groups). Agents that do not answer within
        ``ACTIVITY_TIMEOUT_S`` are left out of this sample rather than stall the reconciler."""
        with self._lock:
            atts = list(self._attempts.values())
        agents = {m.node_id: m.agent for a in atts for m in a.members if m.agent is not None}
        refs = {nid: agent.cpu_seconds.remote() for nid, agent in agents.items()}
        cpu: dict[str, float] = {}
        for _nid, ref in refs.items():
            with contextlib.suppress(Exception):  # a dead or slow agent: no sample from it
                cpu.update(ray.get(ref, timeout=ACTIVITY_TIMEOUT_S))
        now = time.monotonic()
        out: dict[tuple[str, int], float] = {}
        adir_keys = {a.key: str(a.launch.attempt_dir.absolute()) for a in atts}
        for a in atts:
            keys = [f"{adir_keys[a.key]}#{m.rank}" for m in a.members]
            if not all(k in cpu for k in keys):
                continue
            total = sum(cpu[k] for k in keys)
            base = self._cpu_base.get(a.key)
            self._cpu_base[a.key] = (total, now)
            if base is None or now <= base[1]:
                continue  # the first sample only sets the baseline
            util = (total - base[0]) / (now - base[1]) / max(1, len(a.members))
            out[a.key] = min(1.0, max(0.0, util))
        return out

    def close(self, kill: bool = False) -> None:
        if self._closing.is_set():
            return
        refs: list[Any] = []
        with self._lock:
            self._closing.set()
            if kill:
                for att in self._attempts.values():
                    refs += self._signal_locked(att, signal.SIGKILL)
        self._wake.set()
        self._poll_now.set()
        if refs:
            try:
                ray.wait(refs, num_returns=len(refs), timeout=10.0)
            except Exception as exc:
                log.warning("ray executor close: %s", exc)
        for t in (self._watcher, self._health):
            if t is not threading.current_thread():
                t.join(5.0)
        if self._owns_ray:
            ray.shutdown()

    # ------------------------------------------------------------------ internals (locked)
    def _signal_locked(self, att: RayAttempt, sig: signal.Signals) -> list[Any]:
        adir = str(att.launch.attempt_dir.absolute())
        return [
            agent.signal.remote(adir, ranks, int(sig))
            for agent, ranks in by_agent(att.live()).values()
        ]

    def _gang_abort_locked(self, att: RayAttempt, failed: RayMember) -> None:
        att.gang_failed = True
        log.warning(
            "job %s attempt %d: rank %d ended with %s; stopping the rest of the gang",
            *att.key,
            failed.rank,
            failed.code,
        )
        self._signal_locked(att, signal.SIGTERM)
        att.kill_by(time.monotonic() + self.gang_grace_s)

    def _arm_ack_locked(self, att: RayAttempt) -> None:
        adir = str(att.launch.attempt_dir.absolute())
        for agent, ranks in by_agent(att.live()).values():
            ref = agent.wait_ack.remote(adir, ranks, ACK_WAIT_S)
            att.ack_refs.append(ref)
            self._ack_refs[ref] = att

    def _member_ended_locked(self, att: RayAttempt, m: RayMember, outcome: Any, lost: bool) -> None:
        code, m.oom, m.strays, m.stop = _outcome(outcome)
        m.done, m.code = True, code
        if lost and not att.stop_requested and att.hold_until is None:
            att.hold_until = time.monotonic() + self.lost_hold_s
        elif not lost and att.fails_gang(code) and att.hold_until is None and att.live():
            self._gang_abort_locked(att, m)

    def _timers_locked(self, now: float) -> None:
        for att in self._attempts.values():
            if att.kill_due(now) and att.live():
                log.warning("job %s attempt %d: grace over, SIGKILL", *att.key)
                self._signal_locked(att, signal.SIGKILL)
            if att.hold_until is not None and att.hold_until <= now and not att.stop_requested:
                att.hold_until = None
                lost = next((m for m in att.members if m.done and m.code is None), None)
                if att.live() and lost is not None and not att.gang_failed:
                    self._gang_abort_locked(att, lost)

    def _finalize_locked(self) -> list[AttemptExit]:
        out: list[AttemptExit] = []
        for key, att in list(self._attempts.items()):
            if att.live() or (att.hold_until is not None and not att.stop_requested):
                continue
            del self._attempts[key]
            for ref in att.ack_refs:
                self._ack_refs.pop(ref, None)
            adir = str(att.launch.attempt_dir.absolute())
            for agent, ranks in by_agent(att.members).values():
                agent.forget.remote(adir, ranks)
            ev = att.exit_event(
                tuple(m.code for m in att.members),
                oom=any(m.oom for m in att.members),
                strays_killed=sum(m.strays for m in att.members),
                stop_reached=(
                    combined_stop([m.stop for m in att.members])
                    if self._records_tell_stops
                    else None
                ),
            )
            out.append(ev)
            log.info("job %s attempt %d ended: codes %s", *key, list(ev.codes))
        return out

    # ------------------------------------------------------------------ threads
    def _watch(self) -> None:
        while not self._closing.is_set():
            with self._lock:
                refs = [*self._refs, *self._ack_refs]
                now = time.monotonic()
                times = [a.kill_at for a in self._attempts.values() if a.kill_at is not None]
                times += [a.hold_until for a in self._attempts.values() if a.hold_until]
            timeout = min([WAIT_CAP_S, *(max(0.0, t - now) for t in times)])
            ready: list[Any] = []
            try:
                if refs:
                    ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
                    if ready and rest:
                        more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                        ready += more
                else:
                    self._wake.wait(timeout)
                    self._wake.clear()
                results = [(ref, *_value(ref)) for ref in ready]
            except Exception:
                if self._closing.is_set():
                    return
                log.exception("ray executor watcher: wait failed")
                time.sleep(0.5)
                continue
            with self._lock:
                acks = [key for r in results if (key := self._result_locked(*r)) is not None]
                self._timers_locked(time.monotonic())
                exits = self._finalize_locked()
                on_exit, on_ack = self._on_exit, self._on_ack
            report(on_exit, on_ack, acks, exits)

    def _result_locked(self, ref: Any, value: Any, lost: bool) -> Key | None:
        """One finished call: a member's run (its exit) or a checkpoint-ack watch; returns the
        attempt's key when it is a new checkpoint ack."""
        if ref in self._refs:
            att, m = self._refs.pop(ref)
            if not m.done:
                self._member_ended_locked(att, m, value, lost)
                if lost:
                    self._poll_now.set()
        elif ref in self._ack_refs:
            att = self._ack_refs.pop(ref)
            att.ack_refs.remove(ref)
            if value is True and not att.acked:
                att.acked = True
                return att.key
            if not att.acked and not att.ack_refs and att.live():
                self._arm_ack_locked(att)
        return None


# ---------------------------------------------------------------------- helpers
def _outcome(value: Any) -> tuple[int | None, bool, int, bool | None]:
    """(code, oom, strays, stop) from what an agent's ``run`` returned (None when it was lost;
    ``stop`` None from an agent that does not send it)."""
    if isinstance(value, dict):
        code, stop = value.get("code"), value.get("stop")
        return (
            code if isinstance(code, int) else None,
            bool(value.get("oom")),
            int(value.get("strays") or 0),
            stop if isinstance(stop, bool) else None,
        )
    return (value if isinstance(value, int) else None), False, 0, None


def _value(ref: Any) -> tuple[Any, bool]:
    """(result, lost): lost when the agent (or its node) died before answering."""
    try:
        return ray.get(ref, timeout=CALL_TIMEOUT_S), False
    except Exception as exc:
        log.warning("ray executor: %s", short(exc))
        return None, True
