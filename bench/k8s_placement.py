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
  pods, so at 130 % both schedulers end full; the 90 % probe is where packing still shows.

kube-scheduler: default profile with NodeResourcesFit's scoring strategy MostAllocated
(``nvidia.com/gpu`` weight 10, cpu and memory 1) from a KubeSchedulerConfiguration, and
``percentageOfNodesToScore: 100`` (``--kube-score-pct``) so it scores every feasible node (its
default samples about half of them at this size, which would handicap its packing).

    PYTHONPATH=src python bench/k8s_placement.py --quick    # 50 nodes
    PYTHONPATH=src python bench/k8s_placement.py            # 200 nodes (1,600 GPUs)

Progress on stderr; the figures last on stdout:
    gpufence_largest_gang=Nx8 kube_scheduler_largest_gang=Nx8
    gpufence_gpu_alloc=... kube_scheduler_gpu_alloc=...
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
GPUS_PER_NODE = 8


def openb_whole_gpu_stream(trace: Path, nodes: int, load: float, seed: int) -> list[int]:
    """GPU counts of the stream, in arrival order (see the module docstring)."""
    pods = [p.num_gpu for p in openb.load_pods(trace) if p.num_gpu >= 1 and p.gpu_milli == 1000]
    if not pods:
        raise SystemExit(f"{trace}: no whole-GPU pods")
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    target, total, out = load * nodes * GPUS_PER_NODE, 0, []
    while True:
        gpus = order[len(out)] if len(out) < len(order) else rng.choice(pods)
        if total + gpus > target:
            return out
        out.append(gpus)
        total += gpus


@dataclass
class Snapshot:
    gpus_bound: int
    gang8: int
    gang4: int


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
    seconds: float
    calibration_ms: float


def _snapshot(rec: kb.PodRecorder, node_names: list[str]) -> Snapshot:
    used: Counter[str] = Counter()
    for r in rec.pods.values():
        if r.node is not None and not r.deleted:
            used[r.node] += r.gpus
    free = [GPUS_PER_NODE - used[n] for n in node_names]
    if min(free) < 0:
        raise SystemExit(f"a node holds more than {GPUS_PER_NODE} GPUs: {used.most_common(3)}")
    return Snapshot(sum(used.values()), sum(f // 8 for f in free), sum(f // 4 for f in free))


def _decided(name: str) -> Callable[[dict[str, kb.PodRecord]], bool]:
    def pred(pods: dict[str, kb.PodRecord]) -> bool:
        r = pods.get(name)
        return r is not None and (r.node is not None or r.unschedulable is not None)

    return pred


def _stream(
    lt: kb.LoopThread,
    rec: kb.PodRecorder,
    objs: list[Any],
    node_names: list[str],
    args: argparse.Namespace,
) -> tuple[int, int, Snapshot | None, Snapshot | None]:
    """FGD's protocol: one pod at a time, withdrawn when reported unschedulable. Also returns
    the snapshots at the first withdrawal and when ``args.probe`` of the GPUs are bound."""
    withdrawn = undecided = 0
    first: Snapshot | None = None
    probe: Snapshot | None = None
    capacity = len(node_names) * GPUS_PER_NODE
    for i, obj in enumerate(objs):
        name = obj.metadata.name
        gpus = int(obj.spec.containers[0].resources.limits[kb.GPU])
        if _snapshot(rec, node_names).gpus_bound + gpus > capacity:
            # fewer GPUs free in the whole cluster than it asks: no scheduler can place it
            # (nothing completes), so it is withdrawn without asking (saves ~2 s a pod)
            withdrawn += 1
            first = first or _snapshot(rec, node_names)
            continue
        kb.create_objects(lt, [obj])
        if not rec.wait(name, _decided(name), args.wait):
            undecided += 1
        if rec.pods[name].node is not None:
            now = _snapshot(rec, node_names)
            if probe is None and now.gpus_bound >= args.probe * capacity:
                probe = now
            continue
        lt.call(lt.client.delete(Pod, name, namespace=NAMESPACE, grace_period=0))
        withdrawn += 1
        if first is None:
            first = _snapshot(rec, node_names)
            kb.log(f"first withdrawal at pod {i}: {rec.pods[name].unschedulable}")
    return withdrawn, undecided, first, probe


def run_one(scheduler: str, stream: list[int], args: argparse.Namespace, work: Path) -> Result:
    sched_name = kb.KUBE_SCHEDULER if scheduler == "kube-scheduler" else kb.GPUFENCE
    kb.log(f"{scheduler}: fresh API server in {work}")
    kc = kb.start_cluster(work, gang_api=False)
    lt = kb.LoopThread(kc.kubeconfig, "bench-client")
    kubelet: kb.KubeletProcess | None = None
    rec, proc = None, None
    try:
        kubelet = kb.KubeletProcess(kc, args.nodes, GPUS_PER_NODE)
        nodes = kubelet.nodes
        kb.namespace(lt, NAMESPACE)
        rec = kb.PodRecorder(lt, NAMESPACE).start()
        if sched_name == kb.KUBE_SCHEDULER:
            cfg = kb.write_kube_scheduler_config(
                work / "kube-scheduler.yaml",
                kc.kube_scheduler_kubeconfig,
                most_allocated=True,
                score_pct=args.kube_score_pct,
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
                kb.PodSpec(f"s-{i:0{width}d}", gpus, None),
                NAMESPACE,
                sched_name,
                gang_api=False,
                labels={"bench": "placement"},
            )
            for i, gpus in enumerate(stream)
        ]
        names = [n.name for n in nodes]
        calibration = kb.calibration_ms()
        t = time.monotonic()
        withdrawn, undecided, first, probe = _stream(lt, rec, objs, names, args)
        seconds = time.monotonic() - t
        kb.log(f"{len(objs)} pods streamed in {seconds:.1f}s, {withdrawn} withdrawn")
        if proc.poll() is not None:
            kb.log(f"{scheduler} exited with {proc.returncode} (logs in {work / 'logs'})")
        end = _snapshot(rec, names)
        bound = sum(1 for r in rec.pods.values() if r.node is not None and not r.deleted)
        return Result(
            scheduler,
            len(objs),
            bound,
            withdrawn,
            undecided,
            args.nodes * GPUS_PER_NODE,
            end,
            first,
            probe,
            seconds,
            calibration,
        )
    finally:
        kb.stop(proc)
        if rec is not None:
            rec.stop()
        if kubelet is not None:
            kb.log(f"kubelet: {kubelet.stop()}")
        lt.close()
        kc.close()


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
    ap.add_argument("--kube-score-pct", type=int, default=100)
    ap.add_argument("--schedulers", default="kube-scheduler,gpufence")
    ap.add_argument("--quick", action="store_true", help="50 nodes")
    ap.add_argument("--keep", action="store_true", help="keep the work directories (logs)")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes = 50
    stream = openb_whole_gpu_stream(args.trace, args.nodes, args.load, args.seed)
    mix = Counter(stream)
    kb.log(f"stream: {len(stream)} pods, {sum(stream)} GPUs; GPUs per pod {sorted(mix.items())}")
    results: dict[str, Result] = {}
    for scheduler in args.schedulers.split(","):
        if scheduler not in ("kube-scheduler", "gpufence"):
            ap.error(f"--schedulers: unknown {scheduler!r} (kube-scheduler, gpufence)")
        work = Path(tempfile.mkdtemp(prefix=f"k8s-pl-{scheduler}-"))
        try:
            results[scheduler] = run_one(scheduler, stream, args, work)
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    for r in results.values():
        print(json.dumps(dataclasses.asdict(r)))
    g, k = results.get("gpufence"), results.get("kube-scheduler")

    def gang(r: Result | None) -> str:
        return f"{r.end.gang8}x8" if r else "nan"

    def alloc(r: Result | None) -> str:
        return f"{r.end.gpus_bound / r.capacity:.4f}" if r else "nan"

    def first(r: Result | None) -> str:
        if r is None or r.first_withdrawal is None:
            return "nan"
        return f"{r.first_withdrawal.gpus_bound / r.capacity:.4f}"

    def probe(r: Result | None) -> str:
        return f"{r.at_probe.gang8}x8" if r is not None and r.at_probe is not None else "nan"

    pct = f"{args.probe * 100:.0f}pct"
    print(
        f"gpufence_largest_gang_at_{pct}={probe(g)} kube_scheduler_largest_gang_at_{pct}={probe(k)}"
    )
    print(
        f"gpufence_alloc_at_first_withdrawal={first(g)}"
        f" kube_scheduler_alloc_at_first_withdrawal={first(k)}"
    )
    print(f"gpufence_largest_gang={gang(g)} kube_scheduler_largest_gang={gang(k)}")
    print(f"gpufence_gpu_alloc={alloc(g)} kube_scheduler_gpu_alloc={alloc(k)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
