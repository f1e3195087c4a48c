"""Shared parts of the Kubernetes benchmarks (k8s_throughput.py, k8s_placement.py,
k8s_failover.py): the test harness's API server and fake kubelet (tests/k8s/), a pod recorder
that watches binds, bulk pod creation, and starting either scheduler.

Everything runs on 127.0.0.1: etcd + kube-apiserver from ``tests/k8s/harness/build.sh``'s cache,
nodes and their kubelets from ``tests/k8s/kubelet.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx2
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.resources.scheduling_v1beta1 import PodGroup

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tests" / "k8s"
sys.path.insert(0, str(HARNESS))

from cluster import LOOPBACK, KubeCluster, free_port  # noqa: E402
from fake_objects import GPU, RUN_S, FakeNode, gpu_nodes, shaped_gpu_nodes  # noqa: E402
from kubelet import FakeKubelet  # noqa: E402

__all__ = ["GPU", "LOOPBACK", "FakeKubelet", "FakeNode", "KubeCluster", "gpu_nodes"]

T = TypeVar("T")
TERMINAL = ("Succeeded", "Failed")
ANN_GPUS = "gpufence.io/gpus"
ANN_BOUND_AT = "gpufence.io/bound-at"
ANN_GANG_PLAN = "gpufence.io/gang-plan"
KUBE_SCHEDULER = "default-scheduler"
GPUFENCE = "gpufence"
# Kubernetes' own gang API (beta, off by default in 1.37): the API server must serve
# scheduling.k8s.io/v1beta1 and both it and kube-scheduler need the GenericWorkload gate, which
# also adds the GangScheduling plugin to kube-scheduler's default profile.
GANG_GATES = "--feature-gates=GenericWorkload=true"
GANG_APISERVER_ARGS = (GANG_GATES, "--runtime-config=scheduling.k8s.io/v1beta1=true")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def bin_dir() -> Path:
    """The harness binaries (built once into the cache by build.sh; GPUFENCE_K8S_BIN_DIR wins)."""
    override = os.environ.get("GPUFENCE_K8S_BIN_DIR")
    if override:
        return Path(override)
    out = subprocess.run(
        ["bash", str(HARNESS / "harness" / "build.sh")],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    ).stdout
    return Path(out.strip().splitlines()[-1])


def start_cluster(work: Path, *, gang_api: bool = True) -> KubeCluster:
    args = GANG_APISERVER_ARGS if gang_api else ()
    # the benchmarks write thousands of objects a second: lift the API server's in-flight caps
    args = (*args, "--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000")
    return KubeCluster(bin_dir(), work, extra_apiserver_args=args).start()


class KubeletProcess:
    """tests/k8s/kubelet.py in a process of its own (so that the benchmark's watch and creates
    do not take its GIL): the kubelets of ``count`` GPU nodes named like ``gpu_nodes``."""

    def __init__(
        self,
        kc: KubeCluster,
        count: int,
        gpus: int = 8,
        inflight: int = 256,
        rack_size: int = 32,
        gpu_counts: Sequence[int] = (),
        node_cpu_mem: Sequence[tuple[int, int]] = (),
    ) -> None:
        """``gpu_counts``: each node's GPUs (a heterogeneous cluster; ``count`` and ``gpus``
        then ignored); ``node_cpu_mem``: each node's CPU (milli) and memory (MiB), if given."""
        if gpu_counts:
            count = len(gpu_counts)
            self.nodes = shaped_gpu_nodes(gpu_counts, rack_size=rack_size, cpu_mem=node_cpu_mem)
        else:
            self.nodes = gpu_nodes(count, gpus, rack_size=rack_size)
        argv = [sys.executable, str(HARNESS / "kubelet.py"), "--kubeconfig", str(kc.kubeconfig)]
        argv += ["--nodes", str(count), "--gpus", str(gpus), "--max-inflight", str(inflight)]
        argv += ["--rack-size", str(rack_size)]
        if gpu_counts:
            argv += ["--gpu-counts", ",".join(str(c) for c in gpu_counts)]
        if node_cpu_mem:
            argv += ["--node-cpu-mem", ",".join(f"{c}/{m}" for c, m in node_cpu_mem)]
        self._log = open(kc.work_dir / "logs" / "kubelet.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._log, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.stop()
            raise RuntimeError(f"fake kubelet did not start (see {self._log.name})")

    def stop(self) -> dict[str, Any]:
        """Stops it; its counters."""
        stats: dict[str, Any] = {}
        if self.proc.poll() is None:
            self.proc.terminate()
            out, _ = self.proc.communicate(timeout=30)
            lines = out.strip().splitlines()
            if lines:
                stats = json.loads(lines[-1])
        self._log.close()
        return stats


# ---- a loop thread and an async client ---------------------------------------------------------


class LoopThread:
    """An asyncio loop on a daemon thread with one lightkube client (HTTP/2)."""

    def __init__(self, kubeconfig: Path, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self.client: AsyncClient = self.call(self._make(kubeconfig))

    @staticmethod
    async def _make(kubeconfig: Path) -> AsyncClient:
        config = KubeConfig.from_file(str(kubeconfig))
        return AsyncClient(config, http2=True, trust_env=False, timeout=httpx2.Timeout(60.0))

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 3600.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.call(self.client.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


async def _bounded(items: Iterable[Callable[[], Coroutine[Any, Any, Any]]], limit: int) -> None:
    sem = asyncio.Semaphore(limit)

    async def one(make: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        async with sem:
            for attempt in range(5):
                try:
                    await make()
                    return
                except ApiError as e:
                    if e.status.code == 409:  # already there: a retried create
                        return
                    if e.status.code != 429 or attempt == 4:
                        raise
                except httpx2.TransportError:
                    if attempt == 4:
                        raise
                await asyncio.sleep(0.2 * (attempt + 1))

    await asyncio.gather(*(one(m) for m in items))


def create_objects(lt: LoopThread, objs: Sequence[Any], limit: int = 48) -> None:
    """Creates lightkube objects concurrently (at most ``limit`` requests in flight)."""
    client = lt.client
    lt.call(_bounded([(lambda o=o: client.create(o)) for o in objs], limit))


def namespace(lt: LoopThread, name: str) -> None:
    create_objects(lt, [Namespace.from_dict({"metadata": {"name": name}})])


# ---- pods --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodSpec:
    """One benchmark pod: name, GPUs, how long it runs, and its gang (name, size) if any."""

    name: str
    gpus: int
    run_s: float | None
    gang: tuple[str, int] | None = None
    cpu_milli: int = 1000
    mem_mib: int = 1024


def pod_object(
    spec: PodSpec, ns: str, scheduler: str, *, gang_api: bool, labels: dict[str, str]
) -> Pod:
    annotations: dict[str, str] = {}
    if spec.run_s is not None:
        annotations[RUN_S] = f"{spec.run_s:g}"
    podspec: dict[str, Any] = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "fake",
                "resources": {
                    "requests": {
                        GPU: str(spec.gpus),
                        "cpu": f"{spec.cpu_milli}m",
                        "memory": f"{spec.mem_mib}Mi",
                    },
                    "limits": {GPU: str(spec.gpus)},
                },
            }
        ],
    }
    if spec.gang is not None:
        gang, size = spec.gang
        annotations["gpufence.io/gang-name"] = gang
        annotations["gpufence.io/gang-size"] = str(size)
        if gang_api:
            podspec["schedulingGroup"] = {"podGroupName": gang}
    meta = {"name": spec.name, "namespace": ns, "labels": labels, "annotations": annotations}
    return Pod.from_dict({"metadata": meta, "spec": podspec})


def pod_group_object(name: str, ns: str, size: int) -> Any:
    return PodGroup.from_dict(
        {
            "metadata": {"name": name, "namespace": ns},
            "spec": {"schedulingPolicy": {"gang": {"minCount": size}}},
        }
    )


# ---- watching binds ----------------------------------------------------------------------------


@dataclass
class PodRecord:
    node: str | None = None
    bound_at: float | None = None  # time.monotonic() when the bind was first seen
    running_at: float | None = None  # ... when Running was first seen (the kubelet's lag)
    phase: str = "Pending"
    gpus: int = 0
    unschedulable: str | None = None  # PodScheduled=False's message, while unbound
    deleted: bool = False
    gpu_ids: tuple[int, ...] = ()  # gpufence.io/gpus: the GPU indices gpufence gave it
    decided_at: float | None = None  # gpufence.io/bound-at: the core's clock (epoch s)

    @property
    def active(self) -> bool:
        return self.node is not None and not self.deleted and self.phase not in TERMINAL


@dataclass
class PodRecorder:
    """Watches the pods of one namespace (list, then watch; re-lists on 410 Gone) and records
    when each was first seen bound, where, and its phase."""

    lt: LoopThread
    ns: str
    pods: dict[str, PodRecord] = field(default_factory=dict)
    rebinds: int = 0  # a pod seen on a second node: never legal
    double_booked: int = 0  # binds onto GPU indices an active pod on that node still holds
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _by_node: dict[str, list[PodRecord]] = field(default_factory=dict)
    _task: Any = None

    def start(self) -> PodRecorder:
        self.lt.call(self._list())
        self._task = asyncio.run_coroutine_threadsafe(self._watch(), self.lt.loop)
        return self

    def stop(self) -> None:
        if self._task is not None:
            self.lt.loop.call_soon_threadsafe(self._task.cancel)

    async def _list(self) -> None:
        listing = self.lt.client.list(Pod, namespace=self.ns)
        async for pod in listing:
            self._seen(pod)
        self._rv = listing.resourceVersion

    async def _watch(self) -> None:
        while True:
            try:
                async for kind, pod in self.lt.client.watch(
                    Pod, namespace=self.ns, resource_version=self._rv, server_timeout=600
                ):
                    self._rv = pod.metadata.resourceVersion
                    self._seen(pod, deleted=kind == "DELETED")
            except ApiError as e:
                if e.status.code == 410:
                    await self._list()
                    continue
                await asyncio.sleep(0.2)
            except httpx2.HTTPError:
                await asyncio.sleep(0.2)

    def _seen(self, pod: Pod, deleted: bool = False) -> None:
        now = time.monotonic()
        name = pod.metadata.name
        with self._cond:
            rec = self.pods.setdefault(name, PodRecord())
            rec.deleted = rec.deleted or deleted
            for c in (pod.status.conditions if pod.status else None) or []:
                if c.type == "PodScheduled" and c.status == "False" and not node_of(pod):
                    rec.unschedulable = c.message or c.reason or "unschedulable"
            node = pod.spec.nodeName
            if node and rec.node is None:
                rec.node, rec.bound_at = node, now
                self._note(rec, pod)
            elif node and node != rec.node:
                self.rebinds += 1
            if pod.status is not None and pod.status.phase:
                rec.phase = pod.status.phase
                if rec.phase != "Pending" and rec.running_at is None:
                    rec.running_at = now
            limits = pod.spec.containers[0].resources.limits or {}
            rec.gpus = int(limits.get(GPU, "0"))
            self._cond.notify_all()

    def _note(self, rec: PodRecord, pod: Pod) -> None:
        """gpufence's placement note on a new bind; counts GPUs handed out twice. Events arrive
        in resourceVersion order, so a pod that finished before the bind is already terminal."""
        ann = pod.metadata.annotations or {}
        if ANN_BOUND_AT not in ann:
            return  # not bound by gpufence
        rec.decided_at = float(ann[ANN_BOUND_AT])
        if ANN_GPUS in ann:
            rec.gpu_ids = tuple(int(g) for g in ann[ANN_GPUS].split(",") if g)
        else:  # the plan of the pod's gang (a single pod is a gang of one)
            plan = json.loads(ann.get(ANN_GANG_PLAN, "[]"))
            mine = [m for m in plan if m.get("pod") == pod.metadata.name]
            rec.gpu_ids = tuple(int(g) for m in mine for g in m.get("gpus", ()))
        assert rec.node is not None
        on_node = self._by_node.setdefault(rec.node, [])
        held = {g for other in on_node if other.active for g in other.gpu_ids}
        if held & set(rec.gpu_ids):
            self.double_booked += 1
        on_node.append(rec)

    def wait(self, what: str, pred: Callable[[dict[str, PodRecord]], bool], timeout: float) -> bool:
        """Blocks until ``pred(pods)`` holds (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not pred(self.pods):
                left = deadline - time.monotonic()
                if left <= 0:
                    log(f"timed out after {timeout:.0f}s waiting for {what}")
                    return False
                self._cond.wait(min(left, 1.0))
        return True

    def bound(self, names: Iterable[str] | None = None) -> int:
        with self._cond:
            recs = self.pods.values() if names is None else (self.pods.get(n) for n in names)
            return sum(1 for r in recs if r is not None and r.node is not None)


def node_of(pod: Pod) -> str | None:
    return pod.spec.nodeName if pod.spec is not None else None


# ---- schedulers --------------------------------------------------------------------------------


def write_kube_scheduler_config(
    path: Path,
    kubeconfig: Path,
    *,
    most_allocated: bool = False,
    qps: float = 5000.0,
    score_pct: int | None = None,
) -> Path:
    """A KubeSchedulerConfiguration: the default profile (plugins as the release ships them);
    with ``most_allocated`` NodeResourcesFit scores MostAllocated with nvidia.com/gpu weighted.
    ``score_pct`` sets percentageOfNodesToScore (default: the release's adaptive sampling).
    The client rate limit is lifted (scheduler_perf does the same): the stock 50 QPS would cap
    binds at 50/s and measure the limiter, not the scheduler."""
    profile: dict[str, Any] = {"schedulerName": KUBE_SCHEDULER}
    if most_allocated:
        profile["pluginConfig"] = [
            {
                "name": "NodeResourcesFit",
                "args": {
                    "scoringStrategy": {
                        "type": "MostAllocated",
                        "resources": [
                            {"name": GPU, "weight": 10},
                            {"name": "cpu", "weight": 1},
                            {"name": "memory", "weight": 1},
                        ],
                    }
                },
            }
        ]
    cfg = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": qps, "burst": int(qps)},
        "leaderElection": {"leaderElect": False},
        "profiles": [profile],
    }
    if score_pct is not None:
        cfg["percentageOfNodesToScore"] = score_pct
    path.write_text(json.dumps(cfg, indent=2))  # JSON is YAML
    return path


def start_kube_scheduler(
    kc: KubeCluster, config: Path, *, gang_api: bool
) -> subprocess.Popen[bytes]:
    args = [f"--config={config}"]
    if gang_api:
        args.append(GANG_GATES)
    return kc.start_scheduler(args)


def write_gpufence_config(path: Path, *, name: str = "k8s-bench") -> Path:
    """The cluster YAML for gpufence on Kubernetes: one partition selecting every node."""
    path.write_text(
        f"name: {name}\n"
        "partitions:\n"
        "  all:\n"
        "    node_selector: {}\n"
        "    admits: [training, batch]\n"
        "    sharing: exclusive\n"
    )
    return path


def start_gpufence(
    kc: KubeCluster,
    config: Path,
    log_path: Path,
    *,
    leader_elect: bool = False,
    identity: str = "gpufence-0",
    extra: Sequence[str] = (),
    port: int | None = None,
) -> subprocess.Popen[bytes]:
    """``python -m gpufence k8s run`` (admin kubeconfig: the benchmarks do not exercise RBAC)."""
    argv = [
        sys.executable,
        "-m",
        "gpufence",
        "k8s",
        "run",
        "--kubeconfig",
        str(kc.kubeconfig),
        "--config",
        str(config),
        "--http",
        f"{LOOPBACK}:{port or free_port()}",
        "--identity",
        identity,
    ]
    argv.append("--leader-elect" if leader_elect else "--no-leader-elect")
    argv += extra
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    with open(log_path, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)


def stop(proc: subprocess.Popen[bytes] | None, grace: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def tear_down(
    proc: subprocess.Popen[bytes] | None,
    rec: PodRecorder | None,
    kubelet: KubeletProcess | None,
    lt: LoopThread,
    kc: KubeCluster,
) -> None:
    """One benchmark run's end, in order: the scheduler, the recorder's watch, the fake
    kubelets (their counters logged), the client loop, the API server."""
    stop(proc)
    if rec is not None:
        rec.stop()
    if kubelet is not None:
        log(f"kubelet: {kubelet.stop()}")
    lt.close()
    kc.close()


def calibration_ms() -> float:
    """A pure-Python yardstick (``sum(range(10**7))``, ms): on this shared 2-core machine the
    other work's load moves every figure, so each run prints it beside its figures."""
    t = time.perf_counter()
    sum(range(10**7))
    return (time.perf_counter() - t) * 1000


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]
