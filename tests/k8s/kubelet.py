"""A fake kubelet for many fake GPU nodes, played against a real kube-apiserver the way KWOK
does: one process (here: one asyncio loop on a thread) stands in for the kubelets of every node.

- ``add_nodes`` creates Node objects (GPU feature-discovery labels, ``nvidia.com/gpu`` and MIG
  allocatable, CPU/memory) with status Ready, and a Lease per node in ``kube-node-lease`` that it
  renews every ``lease_interval_s`` while the node is Ready.
- It watches every pod bound to a node (one watch, ``spec.nodeName!=``, filtered to its nodes):
  a bound pod is set Running (PodScheduled/Initialized/ContainersReady/Ready, startTime, running
  container statuses), then Succeeded or Failed ``sim.gpufence.io/run-s`` seconds later with the
  exit code of ``sim.gpufence.io/exit-code`` (no ``run-s``: it runs until deleted).
- A pod with a deletionTimestamp is deleted with gracePeriodSeconds=0 once its grace has passed
  (at once when it had already finished), as a kubelet does after killing the containers.
- ``set_ready(node, False)`` plays a dead kubelet: Ready=False plus the ``not-ready`` NoSchedule
  taint (the node lifecycle controller's part: there is no controller-manager here), no lease
  renewals, and its pods frozen until ``set_ready(node, True)``.
- The watch survives ``410 Gone`` by re-listing (and forgetting pods that vanished meanwhile) and
  an unreachable API server by retrying with backoff from its last resourceVersion.

Requests go through lightkube's async client over one HTTP/2 connection, at most ``max_inflight``
at a time, so 1,000 nodes and 10,000 pods cost a few seconds of API calls, not minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx2
from fake_objects import (
    EXIT_CODE,
    NOT_READY_TAINT,
    RUN_S,
    FakeNode,
    gpu_nodes,
    micro_time,
    now_utc,
    rfc3339,
    shaped_gpu_nodes,
    status_patch,
)
from lightkube import ALL_NS, ApiError, AsyncClient, KubeConfig
from lightkube.operators import not_equal
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

LEASE_NAMESPACE = "kube-node-lease"
FIELD_MANAGER = "gpufence-fake-kubelet"

log = logging.getLogger("gpufence.fake_kubelet")
T = TypeVar("T")


@dataclass
class _NodeState:
    spec: FakeNode
    ready: bool = True
    parked: set[str] = field(default_factory=set)  # pod uids frozen while NotReady


@dataclass
class _PodState:
    namespace: str
    name: str
    node: str
    started: bool = False  # the Running patch was sent (or observed)
    done: bool = False  # terminal (sent or observed)
    deleting: bool = False  # a finalizing delete is scheduled
    timer: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


@dataclass
class KubeletStats:
    """Counters the tests and benchmarks read."""

    running: int = 0  # Running patches sent
    finished: int = 0  # Succeeded/Failed patches sent
    finalized: int = 0  # deletes with gracePeriodSeconds=0 sent
    relists: int = 0  # re-lists after 410 Gone
    watch_restarts: int = 0  # watches re-opened after an error
    lease_renewals: int = 0
    errors: int = 0  # API calls that failed (logged)


class FakeKubelet:
    """The kubelets of many fake nodes. ``start()`` runs its loop on a daemon thread; the public
    methods are synchronous and thread-safe (they hand coroutines to that loop)."""

    def __init__(
        self,
        kubeconfig: str | Path,
        *,
        lease_interval_s: float = 10.0,
        lease_duration_s: int = 40,
        max_inflight: int = 64,
        watch_timeout_s: int = 300,
    ) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.lease_interval_s = lease_interval_s
        self.lease_duration_s = lease_duration_s
        self.max_inflight = max_inflight
        self.watch_timeout_s = watch_timeout_s
        self.stats = KubeletStats()
        self._nodes: dict[str, _NodeState] = {}
        self._pods: dict[str, _PodState] = {}  # by uid
        self._rv: str | None = None  # the pod watch's last resourceVersion
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fake-kubelet", daemon=True
        )
        self._client: AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watch_task: asyncio.Task[None] | None = None
        self._stopping = False

    # ---- lifecycle (sync, any thread) --------------------------------------------------------

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> FakeKubelet:
        self._thread.start()
        self._call(self._astart())
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._astop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 600.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def add_nodes(self, nodes: Iterable[FakeNode]) -> None:
        """Registers the nodes (Node, status Ready, no not-ready taint, Lease); an existing Node of
        the same name is adopted. Returns once all are registered."""
        self._call(self._add_nodes(list(nodes)))

    def set_ready(self, node: str, ready: bool) -> None:
        self._call(self._set_ready(node, ready))

    def pause_watch(self) -> None:
        """Tests: drop the pod watch as a long network partition would (its resourceVersion is
        kept, so ``resume_watch`` re-opens it from there, or re-lists on 410 Gone)."""
        self._call(self._pause_watch())

    def resume_watch(self) -> None:
        self._call(self._resume_watch())

    def pod_count(self) -> int:
        return len(self._pods)

    # ---- loop side ---------------------------------------------------------------------------

    async def _astart(self) -> None:
        config = KubeConfig.from_file(str(self.kubeconfig))
        self._client = AsyncClient(config, http2=True, field_manager=FIELD_MANAGER, trust_env=False)
        self._sem = asyncio.Semaphore(self.max_inflight)
        self._spawn(self._heartbeats())
        await self._resume_watch()

    async def _astop(self) -> None:
        self._stopping = True  # timers that still fire spawn nothing
        for pod in self._pods.values():
            pod.cancel()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any] | None:
        if self._stopping:
            coro.close()
            return None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _api(self, what: str, call: Callable[[], Awaitable[T]]) -> T | None:
        """One API call under the in-flight limit (``call`` makes the request once a slot is
        free); an error is logged and counted, not raised (a kubelet retries through its next
        sync; the tests assert on the outcome)."""
        assert self._sem is not None
        async with self._sem:
            try:
                return await call()
            except (ApiError, httpx2.HTTPError) as e:
                self.stats.errors += 1
                log.warning("fake kubelet: %s failed: %s", what, e)
                return None

    @property
    def client(self) -> AsyncClient:
        assert self._client is not None, "fake kubelet not started"
        return self._client

    # ---- nodes -------------------------------------------------------------------------------

    async def _add_nodes(self, nodes: list[FakeNode]) -> None:
        await asyncio.gather(*(self._register(n) for n in nodes))

    async def _register(self, node: FakeNode) -> None:
        assert self._sem is not None
        async with self._sem:
            try:
                await self.client.create(Node.from_dict(node.manifest()))
            except ApiError as e:
                if e.status.code != 409:  # 409: already there (a restarted kubelet adopts it)
                    raise
        self._nodes[node.name] = _NodeState(node)
        await self._write_node(node.name, ready=True)
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": node.name, "namespace": LEASE_NAMESPACE},
            "spec": {
                "holderIdentity": node.name,
                "leaseDurationSeconds": self.lease_duration_s,
                "renewTime": micro_time(),
            },
        }
        async with self._sem:
            try:
                await self.client.create(Lease.from_dict(lease))
            except ApiError as e:
                if e.status.code != 409:
                    raise

    async def _write_node(self, name: str, *, ready: bool) -> None:
        """Status (Ready condition, allocatable) and the not-ready taint, as one kubelet status
        update plus the node lifecycle controller's taint."""
        state = self._nodes[name]
        status = Node.Status
        await self._api(
            f"node {name} status",
            lambda: self.client.patch(
                status, name, state.spec.status(ready), patch_type=PatchType.MERGE
            ),
        )
        current = await self._api(f"get node {name}", lambda: self.client.get(Node, name))
        if current is None:
            return
        taints = [t.to_dict() for t in (current.spec.taints or []) if t.key != NOT_READY_TAINT]
        if not ready:
            taints.append({"key": NOT_READY_TAINT, "effect": "NoSchedule", "timeAdded": rfc3339()})
        patch = {"metadata": {"resourceVersion": current.metadata.resourceVersion}}
        patch["spec"] = {"taints": taints or None}  # type: ignore[assignment]
        await self._api(
            f"node {name} taints",
            lambda: self.client.patch(Node, name, patch, patch_type=PatchType.MERGE),
        )

    async def _set_ready(self, name: str, ready: bool) -> None:
        state = self._nodes.get(name)
        if state is None:
            raise KeyError(f"node {name!r} is not one of this fake kubelet's nodes")
        state.ready = ready
        await self._write_node(name, ready=ready)
        if ready:
            parked, state.parked = state.parked, set()
            for uid in parked:
                self._spawn(self._resync_pod(uid))

    async def _heartbeats(self) -> None:
        """Renews every Ready node's Lease once per interval, spread over the interval so 1,000
        nodes are 100 small PATCHes a second at 10 s, not a burst of 1,000."""
        while True:
            names = [n for n, s in self._nodes.items() if s.ready]
            if not names:
                await asyncio.sleep(self.lease_interval_s)
                continue
            gap = self.lease_interval_s / len(names)
            for name in names:
                if self._nodes[name].ready:
                    self._spawn(self._renew(name))
                await asyncio.sleep(gap)

    async def _renew(self, name: str) -> None:
        patch = {"spec": {"holderIdentity": name, "renewTime": micro_time()}}
        done = await self._api(
            f"lease {name}",
            lambda: self.client.patch(
                Lease, name, patch, namespace=LEASE_NAMESPACE, patch_type=PatchType.MERGE
            ),
        )
        if done is not None:
            self.stats.lease_renewals += 1

    # ---- the pod watch -----------------------------------------------------------------------

    async def _pause_watch(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
            self._watch_task = None

    async def _resume_watch(self) -> None:
        if self._watch_task is None:
            if self._rv is None:
                await self._relist()
            self._watch_task = self._spawn(self._watch())

    async def _relist(self) -> None:
        """Lists every bound pod, reconciles (a pod gone meanwhile is forgotten) and remembers
        the list's resourceVersion for the next watch."""
        listing = self.client.list(Pod, namespace=ALL_NS, fields={"spec.nodeName": not_equal("")})
        seen: set[str] = set()
        async for pod in listing:
            seen.add(pod.metadata.uid)
            self._on_pod("ADDED", pod)
        for uid in [u for u in self._pods if u not in seen]:
            self._pods.pop(uid).cancel()
        self._rv = listing.resourceVersion

    async def _watch(self) -> None:
        backoff = 0.2
        while True:
            try:
                watch = self.client.watch(
                    Pod,
                    namespace=ALL_NS,
                    fields={"spec.nodeName": not_equal("")},
                    resource_version=self._rv,
                    server_timeout=self.watch_timeout_s,
                )
                async for kind, pod in watch:
                    backoff = 0.2
                    self._rv = pod.metadata.resourceVersion
                    self._on_pod(kind, pod)
            except ApiError as e:
                self.stats.watch_restarts += 1
                if e.status.code == 410:  # our resourceVersion was compacted away: re-list
                    log.info("fake kubelet: pod watch 410 Gone, re-listing")
                    self.stats.relists += 1
                    await self._relist_retrying()
                    continue
                log.warning("fake kubelet: pod watch failed: %s", e)
            except (httpx2.HTTPError, OSError) as e:
                self.stats.watch_restarts += 1
                log.info("fake kubelet: pod watch dropped (%s), retrying", e)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _relist_retrying(self) -> None:
        backoff = 0.2
        while True:
            try:
                await self._relist()
                return
            except (ApiError, httpx2.HTTPError, OSError) as e:
                log.info("fake kubelet: re-list failed (%s), retrying", e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    # ---- pods --------------------------------------------------------------------------------

    def _on_pod(self, kind: str, pod: Pod) -> None:
        meta, node = pod.metadata, pod.spec.nodeName
        uid = meta.uid
        if node not in self._nodes or kind == "BOOKMARK":
            return
        if kind == "DELETED":
            gone = self._pods.pop(uid, None)
            if gone is not None:
                gone.cancel()
            return
        state = self._pods.get(uid)
        if state is None:
            state = self._pods[uid] = _PodState(meta.namespace, meta.name, node)
        phase = pod.status.phase if pod.status else None
        if phase in ("Succeeded", "Failed"):
            state.done = True
            state.cancel()
        if meta.deletionTimestamp is not None:
            self._finalize_later(uid, state, meta.deletionGracePeriodSeconds or 0)
            return
        if not self._nodes[node].ready:
            self._nodes[node].parked.add(uid)
            return
        if state.done:
            return
        if phase == "Running" and not state.started:  # a re-list, or a kubelet restart
            state.started = True
            self._finish_later(uid, state, pod, pod.status.startTime or now_utc())
        elif phase == "Pending" and not state.started:
            state.started = True
            self._spawn(self._run(uid, state, pod))

    async def _run(self, uid: str, state: _PodState, pod: Pod) -> None:
        now = now_utc()
        containers = [c.name for c in pod.spec.containers]
        running = {c: {"running": {"startedAt": rfc3339(now)}} for c in containers}
        patch = status_patch("Running", now, ready=True, containers=running)
        if await self._patch_status(state, patch) is None:
            state.started = False  # the next event or re-list retries
            return
        self.stats.running += 1
        self._finish_later(uid, state, pod, now)

    def _finish_later(self, uid: str, state: _PodState, pod: Pod, started: datetime) -> None:
        annotations = pod.metadata.annotations or {}
        if RUN_S not in annotations:
            return
        try:
            run_s = float(annotations[RUN_S])
            code = int(annotations.get(EXIT_CODE, "0"))
        except ValueError:
            log.warning("fake kubelet: pod %s has a bad %s/%s", state.name, RUN_S, EXIT_CODE)
            return
        delay = max(0.0, run_s - (now_utc() - started).total_seconds())
        containers = [c.name for c in pod.spec.containers]
        state.timer = self._loop.call_later(
            delay, lambda: self._spawn(self._finish(uid, state, containers, started, code))
        )

    async def _finish(
        self, uid: str, state: _PodState, containers: list[str], started: datetime, code: int
    ) -> None:
        state.timer = None
        if state.done or state.deleting or self._pods.get(uid) is not state:
            return
        node = self._nodes[state.node]
        if not node.ready:
            node.parked.add(uid)
            return
        now = now_utc()
        term = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": rfc3339(started),
            "finishedAt": rfc3339(now),
        }
        statuses = {c: {"terminated": term} for c in containers}
        phase = "Succeeded" if code == 0 else "Failed"
        if await self._patch_status(state, status_patch(phase, started, False, statuses)):
            state.done = True
            self.stats.finished += 1

    async def _patch_status(self, state: _PodState, patch: dict[str, Any]) -> Any:
        return await self._api(
            f"pod {state.namespace}/{state.name} status",
            lambda: self.client.patch(
                Pod.Status, state.name, patch, namespace=state.namespace, patch_type=PatchType.MERGE
            ),
        )

    def _finalize_later(self, uid: str, state: _PodState, grace_s: float) -> None:
        if state.deleting:
            return
        if not self._nodes[state.node].ready:
            self._nodes[state.node].parked.add(uid)
            return
        state.deleting = True
        state.cancel()
        # the containers get the grace (deletionGracePeriodSeconds) from when the kubelet sees
        # the deletion, as a kubelet counts it (deletionTimestamp has whole seconds only); a pod
        # that already finished has none left to stop
        delay = 0.0 if state.done else float(grace_s)
        state.timer = self._loop.call_later(delay, lambda: self._spawn(self._finalize(uid, state)))

    async def _finalize(self, uid: str, state: _PodState) -> None:
        state.timer = None
        if self._pods.get(uid) is not state:
            return
        assert self._sem is not None
        async with self._sem:
            try:
                await self.client.delete(Pod, state.name, namespace=state.namespace, grace_period=0)
            except ApiError as e:
                if e.status.code != 404:  # 404: gone already (a terminal pod goes at once)
                    self.stats.errors += 1
                    log.warning("fake kubelet: delete pod %s failed: %s", state.name, e)
                    state.deleting = False  # the next event or re-list retries
                return
            except httpx2.HTTPError as e:
                self.stats.errors += 1
                log.warning("fake kubelet: delete pod %s failed: %s", state.name, e)
                state.deleting = False
                return
        self.stats.finalized += 1

    async def _resync_pod(self, uid: str) -> None:
        """A parked pod after its node came back: act on its current state."""
        state = self._pods.get(uid)
        if state is None:
            return
        pod = await self._api(
            f"get pod {state.namespace}/{state.name}",
            lambda: self.client.get(Pod, state.name, namespace=state.namespace),
        )
        if pod is not None and pod.metadata.uid == uid:
            state.started = state.started and pod.status.phase != "Pending"
            self._on_pod("MODIFIED", pod)


def main(argv: list[str] | None = None) -> int:
    """Runs the fake kubelets of ``--nodes`` GPU nodes (identical, or ``--gpu-counts``) in this
    process until SIGTERM or SIGINT (benchmarks run it apart, so it has a core's worth of GIL to
    itself). Prints ``ready`` once the nodes are registered, and its counters as JSON when it
    stops."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--prefix", default="gpu")
    ap.add_argument("--rack-size", type=int, default=32)
    ap.add_argument(
        "--gpu-counts", default="", help="GPUs of each node, comma-separated (overrides --gpus)"
    )
    ap.add_argument(
        "--node-cpu-mem", default="", help="each node's CPU milli/memory MiB: 96000/393216,..."
    )
    ap.add_argument("--lease-interval", type=float, default=10.0)
    ap.add_argument("--max-inflight", type=int, default=64, help="API calls in flight at most")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with FakeKubelet(
        args.kubeconfig, lease_interval_s=args.lease_interval, max_inflight=args.max_inflight
    ) as kubelet:
        if args.gpu_counts:
            counts = [int(c) for c in args.gpu_counts.split(",")]
            if len(counts) != args.nodes:
                ap.error(f"--gpu-counts gives {len(counts)} nodes, --nodes {args.nodes}")
            cpu_mem = [
                (int(c), int(m))
                for c, m in (e.split("/") for e in args.node_cpu_mem.split(",") if e)
            ]
            if cpu_mem and len(cpu_mem) != len(counts):
                ap.error(f"--node-cpu-mem gives {len(cpu_mem)} nodes, --gpu-counts {len(counts)}")
            nodes = shaped_gpu_nodes(counts, args.prefix, args.rack_size, cpu_mem)
        else:
            nodes = gpu_nodes(args.nodes, args.gpus, args.prefix, args.rack_size)
        kubelet.add_nodes(nodes)
        print("ready", flush=True)
        stop.wait()
    print(json.dumps(kubelet.stats.__dict__), flush=True)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
