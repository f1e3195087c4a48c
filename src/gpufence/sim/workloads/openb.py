"""Loader for the Alibaba cluster-trace-gpu-v2023 ("openb", FGD / USENIX ATC'23) CSVs.

Node list ``openb_node_list_*.csv`` -- columns used: ``sn`` (name), ``cpu_milli``,
``memory_mib``, ``gpu`` (count), ``model`` (GPU model; empty for CPU-only nodes).
Pod list ``openb_pod_list_*.csv`` -- columns used: ``name``, ``cpu_milli``, ``memory_mib``,
``num_gpu``, ``gpu_milli`` (per-GPU share, 1000 = whole GPU), ``gpu_spec`` (allowed models joined
by ``|``, empty = any; absent in the ``multigpu*`` files). Ignored: ``qos``, ``pod_phase`` and the
creation/deletion/scheduled times (the FGD protocol replays arrivals only).

Assumptions (see research/traces.md §2.1-2.2):
- one gpufence node per CSV row, all of its GPUs in one NVLink domain, one rack; nodes with no
  GPU are skipped by ``build_cluster`` (the FGD experiments use the GPU-node list only);
- a pod with ``num_gpu == 1`` and ``gpu_milli < 1000`` is a GPU-sharing pod ->
  ``GpuRequest.fraction(gpu_milli)`` (no GPU memory: the trace has none, so GPU memory never
  binds); ``num_gpu >= 1`` whole GPUs -> ``GpuRequest.whole(num_gpu)`` on one node;
  ``num_gpu == 0`` -> a CPU-only pod, ``GpuRequest.whole(0)`` (it takes CPU and host memory);
- ``memory_mib`` is host memory (checked against the node's ``memory_mib``);
- GPU memory per model is the real one (T4/P100/V100M16 16 GiB, V100M32 32 GiB, A10 24 GiB);
  G2/G3 are undisclosed models: no pod requests GPU memory, so the value never binds; we use
  32 GiB (an assumption that only matters if someone adds GPU-memory requests).
"""

from __future__ import annotations

import csv
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gpufence.model.cluster import Cluster
from gpufence.model.hardware import Gpu, GpuType, Node
from gpufence.model.job import MILLI_PER_GPU, GpuRequest, Job, WorkloadClass
from gpufence.model.partition import Partition, QueueSpec, SharingMode
from gpufence.sched.placement.scoring import PodSpec
from gpufence.sim.workloads.demand import open_trace

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
GPU_MEMORY_GIB = {"T4": 16.0, "P100": 16.0, "V100M16": 16.0, "V100M32": 32.0, "A10": 24.0}
UNDISCLOSED_GPU_MEMORY_GIB = 32.0  # G2, G3 and any other model not listed above
PARTITION = "openb"


@dataclass(frozen=True, slots=True)
class OpenbNode:
    name: str
    cpu_milli: int
    mem_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class OpenbPod:
    name: str
    cpu_milli: int
    mem_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU
    gpu_spec: tuple[str, ...] = ()
    qos: str = ""  # LS / BE / Burstable / Guaranteed, when the file has the column
    creation_time: float | None = None  # seconds from trace start, when present
    deletion_time: float | None = None  # empty: still running at the end of the trace

    @property
    def sharing(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI_PER_GPU

    @property
    def total_milli(self) -> int:
        """GPU milli the pod requests in all (what the protocol sums to reach ``tune``)."""
        return self.num_gpu * self.gpu_milli

    def spec(self) -> PodSpec:
        """The pod's spec as the typical-pod statistics count it."""
        if self.num_gpu == 0:
            return PodSpec(self.cpu_milli, 0, 0, self.gpu_spec)
        return PodSpec(self.cpu_milli, self.gpu_milli, self.num_gpu, self.gpu_spec)


def _rows(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    with open_trace(path) as f:  # plain or gzip
        reader = csv.DictReader(f)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing columns {', '.join(missing)} (need {required})")
        return list(enumerate(reader, start=2))


def _int(path: Path, line: int, row: dict[str, str], col: str) -> int:
    try:
        v = int(row[col])
    except ValueError:
        raise ValueError(f"{path}:{line}: {col} must be an integer (got {row[col]!r})") from None
    if v < 0:
        raise ValueError(f"{path}:{line}: {col} must be >= 0 (got {v})")
    return v


def _time(path: Path, line: int, row: dict[str, str], col: str) -> float | None:
    """Optional time column: absent (multigpu files) or empty gives None."""
    raw = (row.get(col) or "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{path}:{line}: {col} must be a number (got {raw!r})") from None


def load_nodes(path: str | Path) -> list[OpenbNode]:
    p = Path(path)
    out: list[OpenbNode] = []
    for line, row in _rows(p, NODE_COLUMNS):
        gpus = _int(p, line, row, "gpu")
        model = row["model"].strip()
        if gpus and not model:
            raise ValueError(f"{p}:{line}: a node with GPUs needs a model")
        out.append(
            OpenbNode(
                row["sn"],
                _int(p, line, row, "cpu_milli"),
                _int(p, line, row, "memory_mib"),
                gpus,
                model,
            )
        )
    return out


def load_pods(path: str | Path) -> list[OpenbPod]:
    p = Path(path)
    out: list[OpenbPod] = []
    for line, row in _rows(p, POD_COLUMNS):
        n = _int(p, line, row, "num_gpu")
        milli = _int(p, line, row, "gpu_milli")
        if n and not 0 < milli <= MILLI_PER_GPU:
            raise ValueError(f"{p}:{line}: gpu_milli must be in 1..1000 (got {milli})")
        if n > 1 and milli != MILLI_PER_GPU:
            raise ValueError(f"{p}:{line}: a pod with {n} GPUs must take them whole")
        spec = (row.get("gpu_spec") or "").strip()
        out.append(
            OpenbPod(
                row["name"],
                _int(p, line, row, "cpu_milli"),
                _int(p, line, row, "memory_mib"),
                n,
                milli if n else 0,
                tuple(t for t in spec.split("|") if t),
                (row.get("qos") or "").strip(),
                _time(p, line, row, "creation_time"),
                _time(p, line, row, "deletion_time"),
            )
        )
    return out


def gpu_type(model: str) -> GpuType:
    return GpuType(model, GPU_MEMORY_GIB.get(model, UNDISCLOSED_GPU_MEMORY_GIB))


def build_cluster(nodes: list[OpenbNode], placement: str, name: str = "openb") -> Cluster:
    """One fractional partition ``openb`` over the GPU nodes, admitting every workload class,
    placed by the scorer named ``placement``."""
    gpu_nodes = [n for n in nodes if n.gpus > 0]
    if not gpu_nodes:
        raise ValueError("the node list has no GPU node")
    out_nodes: list[Node] = []
    gpus: list[Gpu] = []
    for i, n in enumerate(gpu_nodes):
        base = len(gpus)
        gpus.extend(Gpu(base + k, i, k, n.model, 0, PARTITION) for k in range(n.gpus))
        out_nodes.append(
            Node(
                i,
                n.name,
                f"{n.model}x{n.gpus}",
                "r0",
                tuple(range(base, base + n.gpus)),
                n.model,
                n.cpu_milli,
                n.mem_mib,
                (tuple(range(n.gpus)),),
            )
        )
    part = Partition(
        PARTITION, frozenset(WorkloadClass), SharingMode.FRACTIONAL, placement=placement
    )
    return Cluster(
        name=name,
        gpu_types={m: gpu_type(m) for m in sorted({n.model for n in gpu_nodes})},
        nodes=tuple(out_nodes),
        gpus=tuple(gpus),
        partitions={PARTITION: part},
        queues={PARTITION: QueueSpec(PARTITION, PARTITION)},
    )


def pod_job(pod: OpenbPod, job_id: str, submit_time: float = 0.0) -> Job:
    # whole(0) = CPU-only
    req = GpuRequest.fraction(pod.gpu_milli) if pod.sharing else GpuRequest.whole(pod.num_gpu)
    return Job(
        id=job_id,
        workload_class=WorkloadClass.BATCH,
        request=req,
        partition=PARTITION,
        submit_time=submit_time,
        cpu_milli=pod.cpu_milli,
        mem_mib=pod.mem_mib,
        gpu_types=pod.gpu_spec,
    )


def typical_counts(pods: list[OpenbPod]) -> Counter[PodSpec]:
    """Pod spec counts over the whole workload (CPU-only pods included), as FGD counts them."""
    return Counter(p.spec() for p in pods)


def arrivals(pods: list[OpenbPod], tune: float, capacity_milli: int, seed: int) -> list[OpenbPod]:
    """The FGD arrival sequence: the workload shuffled, then pods drawn with replacement and
    appended while the summed GPU requests stay within ``tune`` x capacity."""
    rng = random.Random(seed)
    seq = list(pods)
    rng.shuffle(seq)
    total = sum(p.total_milli for p in seq)
    target = tune * capacity_milli
    while pods:
        extra = pods[rng.randrange(len(pods))]
        if total + extra.total_milli > target:
            break
        seq.append(extra)
        total += extra.total_milli
    return seq


def resolve_csv(name_or_path: str, directory: Path, kind: str) -> Path:
    """A workload or node-list name in ``directory`` (``default`` ->
    ``openb_pod_list_default.csv``), or the path of a CSV."""
    p = Path(name_or_path)
    if p.suffix == ".csv" or p.exists():
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such file")
        return p
    for cand in (f"openb_{kind}_list_{name_or_path}.csv", f"{name_or_path}.csv", name_or_path):
        if (directory / cand).is_file():
            return directory / cand
    known = sorted(f.stem.removeprefix(f"openb_{kind}_list_") for f in directory.glob("*.csv"))
    raise FileNotFoundError(
        f"no {kind} list '{name_or_path}' in {directory} (known: {', '.join(known)})"
    )
