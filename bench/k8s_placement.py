"""Placement quality on a real kube-apiserver: gpufence vs kube-scheduler's NodeResourcesFit
MostAllocated, on a whole-GPU openb stream to 130 % of capacity.

The stream: the whole-GPU pods of Alibaba's openb trace (``openb_pod_list_default.csv``,
cluster-trace-gpu-v2023, loaded by ``gpufence.sim.workloads.openb``: pods with ``num_gpu >= 1``
and ``gpu_milli == 1000``: 3,911 of 1 GPU, 16 of 2, 15 of 4, 44 of 8), shuffled (seeded), drawn
again with replacement once used up, and cut where the summed requests reach ``--load`` x the
cluster's GPUs. Pods run until the end (no completions), one CPU and 1 GiB each: GPUs decide.

The protocol is FGD's (the openb paper's simulator): pods arrive one at a time; each is either
bound or reported unschedulable (``PodScheduled=False``, which both schedulers write) before the
next arrives, and an unschedulable pod is withdrawn (deleted), not retried. So the order of the
stream is the order of decisions, and fragmentation shows as pods that no longer fit. A pod
asking for more GPUs than the whole cluster has free is withdrawn without being created (no
placement could take it; nothing completes).

Each scheduler runs alone against a fresh API server with ``--nodes`` fake 8-GPU nodes
(tests/k8s/kubelet.py). Figures, from the binds seen:
* GPU allocation = GPUs of bound pods / GPUs of all nodes, at the end of the stream; and at the
  first withdrawal (how full the cluster got before the first pod did not fit);
* the largest gang still placeable at the end, and at the first withdrawal: the most pods of
  8 GPUs the free GPUs can hold, one whole node each (printed ``Nx8``; the 4-GPU figure in the
  JSON lines); and the same once ``--probe`` (90 %) of the GPUs are bound, where the free 10 %
  is either whole nodes (packed) or scattered (fragmented). openb's whole-GPU mix is 98 % one-GPU
  pods, so at 130 % every scheduler ends full; the 90 % probe is where packing still shows.
* the largest *rack-local* gang at the probe: the most 8-GPU pods one rack's free GPUs can hold
  (nodes carry a ``gpufence.io/rack`` label, ``--rack-size`` nodes each, 8 by default: 64 GPUs,
  one leaf switch). A training gang's all-reduce wants one rack; kube-scheduler does not see
  racks, so the whole nodes it leaves free are wherever its ties fell.

CPU and memory: by default (``--resources gpus``) every pod asks 1 CPU and 1 GiB and every
node has 128 CPUs and 1 TiB, so GPUs alone decide, as the stream is defined. ``--resources
trace`` gives pods their trace CPU and memory (a 1-GPU pod asks 11.4 cores at the median, up to
24) and openb nodes theirs (96 cores on most 8-GPU nodes, 104 on most 2-GPU ones): then CPU runs
out before GPUs on some nodes and GPUs are stranded, FGD's setting.

kube-scheduler, two settings, each alone on its own fresh API server: the default profile with
NodeResourcesFit's scoring strategy MostAllocated (``nvidia.com/gpu`` weight 10, cpu and memory 1)
from a KubeSchedulerConfiguration, and
* ``kube-scheduler``: ``percentageOfNodesToScore: 100``, so it scores every feasible node (its
  best packing);
* ``kube-scheduler-sampled``: the release's adaptive default, which at 200 nodes scores the
  first 100 feasible nodes it finds from a rotating start; what an operator who only switches
  the scoring strategy gets.

    PYTHONPATH=src python bench/k8s_placement.py --quick    # 50 nodes
    PYTHONPATH=src python bench/k8s_placement.py            # 200 nodes (1,600 GPUs)

Progress on stderr; the figures last on stdout, one line per figure, gpufence first:
    gpufence_largest_rack_gang_at_90pct=Nx8 kube_scheduler_largest_rack_gang_at_90pct=Nx8 ...
    ...
    gpufence_gpu_alloc=... kube_scheduler_gpu_alloc=... kube_scheduler_sampled_gpu_alloc=...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube.resources.core_v1 import Pod

import k8s_common as kb
from gpufence.sim.workloads import openb

NAMESPACE = "bench"
TRACE_DIR = kb.ROOT.parent / "shared" / "traces" / "alibaba-gpu-v2023"
NODE_LIST = "openb_node_list_gpu_node.csv"


@dataclass(frozen=True)
class Shape:
    """What a pod asks or a node has: GPUs, CPU (milli-cores) and host memory (MiB)."""

    gpus: int
    cpu_milli: int
    mem_mib: int


GPU_ONLY_POD = (1000, 1024)  # --resources gpus: every pod 1 CPU and 1 GiB
GPU_ONLY_NODE = (128_000, 1024 * 1024)  # and every node 128 CPUs, 1 TiB (the fake default)


def openb_whole_gpu_stream(
    trace: Path, capacity: int, load: float, seed: int, trace_resources: bool
) -> list[Shape]:
    """The stream, in arrival order (see the module docstring): each pod's GPUs, and its CPU and
    memory from the trace where ``trace_resources``, else ``GPU_ONLY_POD``."""
    pods = [
        Shape(p.num_gpu, *((p.cpu_milli, p.mem_mib) if trace_resources else GPU_ONLY_POD))
        for p in openb.load_pods(trace)
        if p.num_gpu >= 1 and p.gpu_milli == 1000
    ]
    if not pods:
        raise SystemExit(f"{trace}: no whole-GPU pods")
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    target, total = load * capacity, 0
    out: list[Shape] = []
    while True:
        pod = order[len(out)] if len(out) < len(order) else rng.choice(pods)
        if total + pod.gpus > target:
            return out
        out.append(pod)
        total += pod.gpus


def openb_nodes(node_list: Path, nodes: int, seed: int, trace_resources: bool) -> list[Shape]:
    """``nodes`` nodes drawn (seeded, without replacement) from openb's GPU nodes: the trace's
    cluster is 617 nodes of 8 GPUs, 54 of 4, 518 of 2 and 24 of 1, so a draw keeps that mix
    (node order shuffled, so racks mix sizes as real rows do). Their CPU and memory are the
    trace's where ``trace_resources``, else ``GPU_ONLY_NODE``."""
    all_nodes = [
        Shape(n.gpus, *((n.cpu_milli, n.mem_mib) if trace_resources else GPU_ONLY_NODE))
        for n in openb.load_nodes(node_list)
        if n.gpus > 0
    ]
    if nodes > len(all_nodes):
        raise SystemExit(f"--nodes {nodes}: {node_list} has only {len(all_nodes)} GPU nodes")
    return random.Random(seed).sample(all_nodes, nodes)


@dataclass
class Snapshot:
    gpus_bound: int
    gang8: int
    gang4: int
    rack_gang8: int  # the most 8-GPU pods the free GPUs of one rack can hold (one node each)


@dataclass
class Result:
    scheduler: str
    pods: int
    bound: int
    withdrawn: int
    undecided: int  # neither bound nor reported unschedulable in time (withdrawn too)
    capacity: int
    end: Snapshot
    first_withdrawal: Snapshot | None
    at_probe: Snapshot | None  # when --probe of the GPUs were bound
    at_capacity_arrived: Snapshot | None  # when the pods arrived so far asked for every GPU
    seconds: float
    calibration_ms: float


@dataclass(frozen=True)
class Fleet:
    """The fake nodes: each one's GPUs and rack label."""

    gpus: dict[str, int]
    rack: dict[str, str]

    @property
    def capacity(self) -> int:
        return sum(self.gpus.values())


def _snapshot(rec: kb.PodRecorder, fleet: Fleet) -> Snapshot:
    """Bound GPUs and the largest gangs the free GPUs hold."""
    used: Counter[str] = Counter()
    for r in rec.pods.values():
        if r.node is not None and not r.deleted:
            used[r.node] += r.gpus
    free = {n: g - used[n] for n, g in fleet.gpus.items()}
    if min(free.values()) < 0:
        raise SystemExit(f"a node holds more GPUs than it has: {used.most_common(3)}")
    per_rack: Counter[str] = Counter()
    for n, f in free.items():
        per_rack[fleet.rack[n]] += f // 8
    return Snapshot(
        sum(used.values()),
        sum(f // 8 for f in free.values()),
        sum(f // 4 for f in free.values()),
        max(per_rack.values(), default=0),
    )


@dataclass
class Marks:
    """The snapshots taken along the stream, each the first time its condition holds."""

    first_withdrawal: Snapshot | None = None
    probe: Snapshot | None = None
    capacity_arrived: Snapshot | None = None


def _decided(name: str) -> Callable[[dict[str, kb.PodRecord]], bool]:
    def pred(pods: dict[str, kb.PodRecord]) -> bool:
        r = pods.get(name)
        return r is not None and (r.node is not None or r.unschedulable is not None)

    return pred


def _stream(
    lt: kb.LoopThread,
    rec: kb.PodRecorder,
    objs: list[Any],
    fleet: Fleet,
    args: argparse.Namespace,
) -> tuple[int, int, Marks]:
    """FGD's protocol: one pod at a time, withdrawn when reported unschedulable. Also returns
    the snapshots at the first withdrawal, when ``args.probe`` of the GPUs are bound and when
    the pods arrived so far asked for every GPU of the cluster."""
    withdrawn = undecided = arrived = 0
    marks = Marks()
    capacity = fleet.capacity
    for i, obj in enumerate(objs):
        name = obj.metadata.name
        gpus = int(obj.spec.containers[0].resources.limits[kb.GPU])
        arrived += gpus
        if _snapshot(rec, fleet).gpus_bound + gpus > capacity:
            # fewer GPUs free in the whole cluster than it asks: no scheduler can place it
            # (nothing completes), so it is withdrawn without asking (saves ~2 s a pod)
            withdrawn += 1
            marks.first_withdrawal = marks.first_withdrawal or _snapshot(rec, fleet)
        else:
            kb.create_objects(lt, [obj])
            if not rec.wait(name, _decided(name), args.wait):
                undecided += 1
            if rec.pods[name].node is None:
                lt.call(lt.client.delete(Pod, name, namespace=NAMESPACE, grace_period=0))
                withdrawn += 1
                if marks.first_withdrawal is None:
                    marks.first_withdrawal = _snapshot(rec, fleet)
                    kb.log(f"first withdrawal at pod {i}: {rec.pods[name].unschedulable}")
        now = _snapshot(rec, fleet)
        if marks.probe is None and now.gpus_bound >= args.probe * capacity:
            marks.probe = now
        if marks.capacity_arrived is None and arrived >= capacity:
            marks.capacity_arrived = now
    return withdrawn, undecided, marks


SCHEDULERS = {
    # name -> kube-scheduler's percentageOfNodesToScore (None: gpufence)
    "gpufence": None,
    "kube-scheduler": 100,  # scores every feasible node: its best packing
    "kube-scheduler-sampled": 0,  # the release's adaptive default (0 = unset)
}


def run_one(
    scheduler: str, stream: list[Shape], shapes: list[Shape], args: argparse.Namespace, work: Path
) -> Result:
    score_pct = SCHEDULERS[scheduler]
    sched_name = kb.GPUFENCE if score_pct is None else kb.KUBE_SCHEDULER
    kb.log(f"{scheduler}: fresh API server in {work}")
    kc = kb.start_cluster(work, gang_api=False)
    lt = kb.LoopThread(kc.kubeconfig, "bench-client")
    kubelet: kb.KubeletProcess | None = None
    rec, proc = None, None
    try:
        kubelet = kb.KubeletProcess(
            kc,
            len(shapes),
            rack_size=args.rack_size,
            gpu_counts=[n.gpus for n in shapes],
            node_cpu_mem=[(n.cpu_milli, n.mem_mib) for n in shapes],
        )
        nodes = kubelet.nodes
        kb.namespace(lt, NAMESPACE)
        rec = kb.PodRecorder(lt, NAMESPACE).start()
        if sched_name == kb.KUBE_SCHEDULER:
            cfg = kb.write_kube_scheduler_config(
                work / "kube-scheduler.yaml",
                kc.kube_scheduler_kubeconfig,
                most_allocated=True,
                score_pct=score_pct or None,
            )
            proc = kb.start_kube_scheduler(kc, cfg, gang_api=False)
        else:
            cfg = kb.write_gpufence_config(work / "cluster.yaml")
            # its pending reason at once (default 5 s): the protocol waits on it
            extra = ["--reason-delay", "0"]
            proc = kb.start_gpufence(kc, cfg, work / "logs" / "gpufence.log", extra=extra)
        width = len(str(len(stream)))
        objs = [
            kb.pod_object(
                kb.PodSpec(f"s-{i:0{width}d}", p.gpus, None, None, p.cpu_milli, p.mem_mib),
                NAMESPACE,
                sched_name,
                gang_api=False,
                labels={"bench": "placement"},
            )
            for i, p in enumerate(stream)
        ]
        fleet = Fleet(
            {n.name: n.gpus for n in nodes}, {n.name: n.labels["gpufence.io/rack"] for n in nodes}
        )
        calibration = kb.calibration_ms()
        t = time.monotonic()
        withdrawn, undecided, marks = _stream(lt, rec, objs, fleet, args)
        seconds = time.monotonic() - t
        kb.log(f"{len(objs)} pods streamed in {seconds:.1f}s, {withdrawn} withdrawn")
        if proc.poll() is not None:
            kb.log(f"{scheduler} exited with {proc.returncode} (logs in {work / 'logs'})")
        end = _snapshot(rec, fleet)
        bound = sum(1 for r in rec.pods.values() if r.node is not None and not r.deleted)
        return Result(
            scheduler,
            len(objs),
            bound,
            withdrawn,
            undecided,
            fleet.capacity,
            end,
            marks.first_withdrawal,
            marks.probe,
            marks.capacity_arrived,
            seconds,
            calibration,
        )
    finally:
        kb.tear_down(proc, rec, kubelet, lt, kc)


def _figure(r: Result | None, what: str) -> str:
    """One figure of ``r`` as printed: "nan" where the scheduler did not run or never got
    there (no withdrawal, probe share never reached)."""
    if r is None:
        return "nan"
    snap = {
        "end": r.end,
        "first": r.first_withdrawal,
        "probe": r.at_probe,
        "arrived": r.at_capacity_arrived,
    }
    s = snap[what.split(".")[0]]
    if s is None:
        return "nan"
    field = what.split(".")[1]
    if field == "alloc":
        return f"{s.gpus_bound / r.capacity:.4f}"
    return f"{getattr(s, field)}x8"


def _print_figures(results: dict[str, Result], probe: float) -> None:
    """The figures, last on stdout: gpufence first, then each kube-scheduler setting."""
    pct = f"{probe * 100:.0f}pct"
    rows = [
        (f"largest_rack_gang_at_{pct}", "probe.rack_gang8"),
        (f"largest_gang_at_{pct}", "probe.gang8"),
        ("alloc_at_first_withdrawal", "first.alloc"),
        ("alloc_at_100pct_arrived", "arrived.alloc"),
        ("largest_gang", "end.gang8"),
        ("gpu_alloc", "end.alloc"),
    ]
    for label, what in rows:
        print(
            " ".join(
                f"{name.replace('-', '_')}_{label}={_figure(results.get(name), what)}"
                for name in ("gpufence", "kube-scheduler", "kube-scheduler-sampled")
                if name in results
            )
        )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--load", type=float, default=1.3, help="stream GPUs / cluster GPUs")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--trace", type=Path, default=TRACE_DIR / "openb_pod_list_default.csv")
    ap.add_argument(
        "--probe", type=float, default=0.9, help="also the largest gang once this share is bound"
    )
    ap.add_argument("--wait", type=float, default=15.0, help="limit on one pod's decision (s)")
    ap.add_argument("--rack-size", type=int, default=8, help="nodes per rack label")
    ap.add_argument(
        "--cluster",
        choices=("openb", "uniform"),
        default="openb",
        help="openb: nodes drawn from the trace's GPU nodes (8/4/2/1 GPUs); uniform: 8 GPUs each",
    )
    ap.add_argument(
        "--resources",
        choices=("trace", "gpus"),
        default="gpus",
        help="trace: pods' CPU and memory and (openb cluster) nodes' from the trace; gpus: "
        "1 CPU and 1 GiB a pod, nodes of 128 CPUs (GPUs decide)",
    )
    ap.add_argument("--schedulers", default="kube-scheduler,kube-scheduler-sampled,gpufence")
    ap.add_argument("--quick", action="store_true", help="50 nodes")
    ap.add_argument("--keep", action="store_true", help="keep the work directories (logs)")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes = 50
    trace_res = args.resources == "trace"
    if args.cluster == "openb":
        shapes = openb_nodes(args.trace.parent / NODE_LIST, args.nodes, args.seed, trace_res)
    else:
        shapes = [Shape(8, *GPU_ONLY_NODE)] * args.nodes
    mix_n = sorted(Counter(n.gpus for n in shapes).items())
    kb.log(f"cluster: {len(shapes)} nodes, GPUs per node {mix_n}, resources {args.resources}")
    stream = openb_whole_gpu_stream(
        args.trace, sum(n.gpus for n in shapes), args.load, args.seed, trace_res
    )
    mix = sorted(Counter(p.gpus for p in stream).items())
    kb.log(f"stream: {len(stream)} pods, {sum(p.gpus for p in stream)} GPUs; GPUs per pod {mix}")
    results: dict[str, Result] = {}
    for scheduler in args.schedulers.split(","):
        if scheduler not in SCHEDULERS:
            ap.error(f"--schedulers: unknown {scheduler!r} (one of {', '.join(SCHEDULERS)})")
        work = Path(tempfile.mkdtemp(prefix=f"k8s-pl-{scheduler}-"))
        try:
            results[scheduler] = run_one(scheduler, stream, shapes, args, work)
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    for r in results.values():
        print(json.dumps(dataclasses.asdict(r)))
    _print_figures(results, args.probe)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
