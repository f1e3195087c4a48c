"""Pods bound per second on a real kube-apiserver: gpufence vs kube-scheduler of the same release.

Each scheduler runs alone against a fresh etcd + kube-apiserver (tests/k8s harness, 127.0.0.1)
with the same fake nodes and the same seeded pods:

* 1,000 fake nodes x 8 GPUs (tests/k8s/kubelet.py plays their kubelets: leases, Running, then
  Succeeded after each pod's ``sim.gpufence.io/run-s``);
* phase 1, throughput: 10,000 pods created while no scheduler runs (all pending), 1-8 GPUs each
  plus 3-pod gangs (4 or 8 GPUs a member; ``--gang-share`` of the pods); they need ~4x the
  cluster's GPUs, so binds keep pace with completions (run 1-3 s). Then the scheduler starts.
  ``pods_per_s`` = (pods bound - 1) / (last bind - first bind), binds as seen by a watch; the
  start-up (process start to first bind) is printed apart;
* phase 2, gang attempts: once phase 1's pods have finished, ``--gangs`` 3-pod gangs (8 GPUs a
  member: three whole nodes) are submitted one at a time to the idle cluster. A gang's attempt
  time = its last member's bind seen - its last member created (the create call returned).
  Its p50 is printed.

kube-scheduler runs with its default profile from a KubeSchedulerConfiguration (client rate
limit lifted, as scheduler_perf does). Kubernetes 1.37's gang scheduling is on for it: the
GenericWorkload feature gate (beta, off by default) on the API server and kube-scheduler, which
adds the GangScheduling plugin to the default profile, ``--runtime-config=
scheduling.k8s.io/v1beta1=true`` to serve PodGroups; each gang gets a PodGroup (gang policy,
minCount 3) and its pods ``spec.schedulingGroup.podGroupName``. The same pods carry gpufence's
``gpufence.io/gang-name``/``gang-size`` annotations. gpufence runs as ``python -m gpufence k8s run
--no-leader-elect`` with one partition selecting every node.

    PYTHONPATH=src python bench/k8s_throughput.py --quick          # 100 nodes, 1,000 pods
    PYTHONPATH=src python bench/k8s_throughput.py                   # 1,000 nodes, 10,000 pods
    PYTHONPATH=src python bench/k8s_throughput.py --schedulers kube-scheduler

Progress on stderr; the figures last on stdout:
    gpufence_gang_p50_s=... kube_scheduler_gang_p50_s=...
    gpufence_pods_per_s=... kube_scheduler_pods_per_s=... ratio=...
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import k8s_common as kb

NAMESPACE = "bench"
SINGLE_GPU_WEIGHTS = {1: 35, 2: 20, 3: 3, 4: 20, 5: 2, 6: 2, 7: 3, 8: 15}


def workload(pods: int, seed: int, gang_share: float) -> list[kb.PodSpec]:
    """``pods`` pods in creation order: singles of 1-8 GPUs and 3-pod gangs, shuffled as units."""
    rng = random.Random(seed)
    gangs = round(pods * gang_share / 3)
    units: list[list[kb.PodSpec]] = []
    sizes, weights = list(SINGLE_GPU_WEIGHTS), list(SINGLE_GPU_WEIGHTS.values())
    for i in range(pods - 3 * gangs):
        gpus = rng.choices(sizes, weights)[0]
        units.append([kb.PodSpec(f"p-{i:05d}", gpus, round(rng.uniform(1.0, 3.0), 2))])
    for g in range(gangs):
        gpus, run_s = rng.choice((4, 8)), round(rng.uniform(1.0, 3.0), 2)
        name = f"g-{g:04d}"
        units.append([kb.PodSpec(f"{name}-{m}", gpus, run_s, (name, 3)) for m in range(3)])
    rng.shuffle(units)
    return [p for unit in units for p in unit]


@dataclass
class Result:
    scheduler: str
    pods: int
    bound: int
    startup_s: float
    window_s: float
    pods_per_s: float
    half_gangs: int  # phase-1 gangs with some but not all members bound at the end
    gang_p50_s: float
    gang_p90_s: float
    gangs_whole: int
    gangs_tried: int
    double_booked: int  # binds onto GPUs still held (gpufence's notes; kube-scheduler has none)
    calibration_ms: float  # measured just before the scheduler started
    kubelet_lag_s: float  # median bind -> Running seen (the fake kubelet keeping up?)


def _run_phase1(
    rec: kb.PodRecorder, specs: list[kb.PodSpec], start: float, timeout: float
) -> tuple[int, float, float]:
    names = [s.name for s in specs]
    rec.wait("phase 1 bound", lambda pods: all(pods[n].node for n in names), timeout)
    times = sorted(t for n in names if (t := rec.pods[n].bound_at) is not None)
    if len(times) < 2:
        return len(times), float("nan"), float("nan")
    return len(times), times[0] - start, times[-1] - times[0]


def _half_gangs(rec: kb.PodRecorder, specs: list[kb.PodSpec]) -> int:
    members: dict[str, list[bool]] = {}
    for s in specs:
        if s.gang is not None:
            members.setdefault(s.gang[0], []).append(rec.pods[s.name].node is not None)
    return sum(1 for bound in members.values() if any(bound) and not all(bound))


def _gang_attempts(
    lt: kb.LoopThread, rec: kb.PodRecorder, scheduler: str, gangs: int, gang_api: bool
) -> list[float]:
    """Phase 2: gangs one at a time into the idle cluster; attempt time of each whole gang."""
    out: list[float] = []
    labels = {"bench": "gang"}
    pod_groups = gang_api and scheduler == kb.KUBE_SCHEDULER
    for g in range(gangs):
        name = f"attempt-{g:03d}"
        specs = [kb.PodSpec(f"{name}-{m}", 8, 1.0, (name, 3)) for m in range(3)]
        if pod_groups:
            kb.create_objects(lt, [kb.pod_group_object(name, NAMESPACE, 3)])
        objs = [
            kb.pod_object(s, NAMESPACE, scheduler, gang_api=pod_groups, labels=labels)
            for s in specs
        ]
        kb.create_objects(lt, objs)
        created = time.monotonic()
        names = [s.name for s in specs]
        if not rec.wait(f"gang {name}", lambda _p, names=names: rec.bound(names) == 3, 60):
            continue
        out.append(max(rec.pods[n].bound_at or created for n in names) - created)
    return out


def run_one(scheduler: str, args: argparse.Namespace, work: Path) -> Result:
    sched_name = kb.KUBE_SCHEDULER if scheduler == "kube-scheduler" else kb.GPUFENCE
    gang_api = not args.no_gang_api
    # Kubernetes' gang API for kube-scheduler's pods; gpufence's front end reads the
    # gpufence.io/gang-* annotations, which every gang pod carries either way
    pod_groups = gang_api and sched_name == kb.KUBE_SCHEDULER
    kb.log(f"{scheduler}: starting a fresh API server in {work}")
    kc = kb.start_cluster(work, gang_api=gang_api)
    lt = kb.LoopThread(kc.kubeconfig, "bench-client")
    kubelet: kb.KubeletProcess | None = None
    rec: kb.PodRecorder | None = None
    proc = None
    try:
        t = time.monotonic()
        kubelet = kb.KubeletProcess(kc, args.nodes)
        kb.log(f"{args.nodes} nodes registered in {time.monotonic() - t:.1f}s")
        kb.namespace(lt, NAMESPACE)
        rec = kb.PodRecorder(lt, NAMESPACE).start()
        specs = workload(args.pods, args.seed, args.gang_share)
        if pod_groups:
            groups = sorted({s.gang[0] for s in specs if s.gang is not None})
            kb.create_objects(lt, [kb.pod_group_object(g, NAMESPACE, 3) for g in groups])
        t = time.monotonic()
        objs = [
            kb.pod_object(s, NAMESPACE, sched_name, gang_api=pod_groups, labels={"bench": "tp"})
            for s in specs
        ]
        kb.create_objects(lt, objs)
        kb.log(f"{len(specs)} pending pods created in {time.monotonic() - t:.1f}s")
        calibration = kb.calibration_ms()
        kb.log(f"calibration_ms={calibration:.0f}")
        start = time.monotonic()
        if sched_name == kb.KUBE_SCHEDULER:
            cfg = kb.write_kube_scheduler_config(
                work / "kube-scheduler.yaml", kc.kube_scheduler_kubeconfig
            )
            proc = kb.start_kube_scheduler(kc, cfg, gang_api=gang_api)
        else:
            cfg = kb.write_gpufence_config(work / "cluster.yaml")
            proc = kb.start_gpufence(kc, cfg, work / "logs" / "gpufence.log")
        bound, startup, window = _run_phase1(rec, specs, start, args.timeout)
        rate = (bound - 1) / window if window and window > 0 else float("nan")
        kb.log(
            f"{scheduler}: {bound}/{len(specs)} bound, {rate:.1f} pods/s, start-up {startup:.1f}s"
        )
        half = _half_gangs(rec, specs)
        names = [s.name for s in specs]
        done = ("Succeeded", "Failed")
        rec.wait("phase 1 finished", lambda pods: all(pods[n].phase in done for n in names), 120)
        attempts = _gang_attempts(lt, rec, sched_name, args.gangs, gang_api)
        if proc.poll() is not None:
            kb.log(f"{scheduler} exited with {proc.returncode} (logs in {work / 'logs'})")
        return Result(
            scheduler,
            len(specs),
            bound,
            startup,
            window,
            rate,
            half,
            kb.percentile(attempts, 50),
            kb.percentile(attempts, 90),
            len(attempts),
            args.gangs,
            rec.double_booked + rec.rebinds,
            calibration,
            kb.percentile(
                [
                    r.running_at - r.bound_at
                    for r in rec.pods.values()
                    if r.running_at is not None and r.bound_at is not None
                ],
                50,
            ),
        )
    finally:
        kb.tear_down(proc, rec, kubelet, lt, kc)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--gang-share", type=float, default=0.09, help="share of pods in 3-pod gangs")
    ap.add_argument("--gangs", type=int, default=30, help="phase-2 gang attempts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900.0, help="phase-1 limit per scheduler (s)")
    ap.add_argument("--schedulers", default="kube-scheduler,gpufence")
    ap.add_argument(
        "--no-gang-api", action="store_true", help="no PodGroups / GenericWorkload gate"
    )
    ap.add_argument("--quick", action="store_true", help="100 nodes, 1,000 pods, 10 gangs")
    ap.add_argument("--keep", action="store_true", help="keep the work directories (logs)")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.pods, args.gangs = 100, 1000, 10
    results: dict[str, Result] = {}
    for scheduler in args.schedulers.split(","):
        if scheduler not in ("kube-scheduler", "gpufence"):
            ap.error(f"--schedulers: unknown {scheduler!r} (kube-scheduler, gpufence)")
        work = Path(tempfile.mkdtemp(prefix=f"k8s-tp-{scheduler}-"))
        try:
            results[scheduler] = run_one(scheduler, args, work)
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    for r in results.values():
        print(
            f"{r.scheduler}: bound {r.bound}/{r.pods} in {r.window_s:.1f}s"
            f" after a {r.startup_s:.1f}s start-up = {r.pods_per_s:.1f} pods/s;"
            f" half-bound gangs at the end: {r.half_gangs};"
            f" gang attempts whole {r.gangs_whole}/{r.gangs_tried}, p50 {r.gang_p50_s:.3f}s"
            f" p90 {r.gang_p90_s:.3f}s; GPUs double-booked: {r.double_booked};"
            f" kubelet lag p50 {r.kubelet_lag_s:.2f}s; calibration_ms={r.calibration_ms:.0f}"
        )
    nan = float("nan")
    g, k = results.get("gpufence"), results.get("kube-scheduler")
    g_rate, k_rate = (g.pods_per_s if g else nan), (k.pods_per_s if k else nan)
    print(
        f"gpufence_gang_p50_s={g.gang_p50_s if g else nan:.3f}"
        f" kube_scheduler_gang_p50_s={k.gang_p50_s if k else nan:.3f}"
    )
    print(
        f"gpufence_pods_per_s={g_rate:.1f} kube_scheduler_pods_per_s={k_rate:.1f}"
        f" ratio={g_rate / k_rate if k_rate else nan:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
