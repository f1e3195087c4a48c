"""Gangs on a Ray cluster: gpufence's control plane + Ray executor vs Ray's own placement groups.

Starts a local Ray cluster (``ray.cluster_utils.Cluster``, 127.0.0.1 only): a GPU-less head and
``--nodes`` (4) nodes x ``--gpus`` (8) fake GPUs. Workload (seeded, shuffled): ``--jobs`` (200)
jobs of ``sleep --job-s`` (2 s): 60 % 1-GPU jobs, 30 % 4-GPU gangs (2 members x 2 GPUs), 10 %
16-GPU gangs (2 members x 8 GPUs), all submitted at once.

1. gpufence: ``ControlPlane`` (real SQLite, real processes) with the ``RayExecutor`` on the
   cluster described from ``ray.nodes()``. Makespan = first submit -> last process reaped
   (launcher records); GPU sharing is checked from the launcher's exec/exit records.
2. Ray alone: per job ``placement_group([{"GPU": 1}] * n, strategy="PACK")`` and one
   ``num_gpus=1`` task per bundle (``sleep`` inside the task); the group is removed when its
   tasks end. Each task records its node, ``ray.get_gpu_ids()`` and its start / end.

Ideal = total GPU-seconds / total GPUs (the area bound; with these sizes nothing tighter holds).
placement_ms = ``Scheduler.step`` wall time of the cycles that bound at least one job.
start_latency = submit -> the job's process runs, measured on the idle cluster after the
backlog (``--probes`` one-GPU jobs, one at a time): for gpufence the launcher's exec time, for
Ray the task's first line. (During the backlog "submit -> exec" is mostly queueing.)

Prints the Ray line (``ray_pg_makespan_over_ideal=.. ray_pg_start_latency_ms_p50=..
ray_pg_gpu_used_twice=..``) then, last: makespan_over_ideal=R placement_ms_p50=A
start_latency_ms_p50=B
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from gpufence.control.base.config import ADMIN, cluster_from_spec_dict, control_config
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.base.member_records import started_file
from gpufence.control.executors.ray.local_cluster import LocalNode, local_ray_cluster
from gpufence.control.executors.ray.nodes import auto_names, cluster_spec, nodes_now
from gpufence.control.executors.ray.ray_executor import RayExecutor
from gpufence.control.gpus.records import Discovery
from gpufence.control.plane import ControlPlane
from gpufence.control.store import database as st
from gpufence.demo import joblogs

SHAPES = ((1, 1), (2, 2), (8, 2))  # (gpus per member, members): 1, 4 and 16 GPUs


def workload(n: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    out = [SHAPES[0]] * round(n * 0.6) + [SHAPES[1]] * round(n * 0.3)
    out += [SHAPES[2]] * (n - len(out))
    rng.shuffle(out)
    return out


def p50(xs: list[float]) -> float:
    return joblogs.percentile(xs, 50)


# ---------------------------------------------------------------------- gpufence
def run_gpufence(
    jobs: list[tuple[int, int]], job_s: float, probes: int, data: Path
) -> dict[str, Any]:
    nodes = nodes_now()
    spec = cluster_spec(nodes)
    executor = RayExecutor(auto_names(nodes))
    cfg = control_config({"stop_grace_s": 2}, data)
    plane = ControlPlane(
        cluster_from_spec_dict(spec),
        cfg,
        Discovery(gpus=(), fake=True, driver=None, source="bench Ray cluster"),
        data / "data",
        executor=executor,
    )
    binds: list[float] = []
    step = plane.scheduler.step

    def timed_step(events: Any, now: float) -> Any:
        t0 = time.perf_counter()
        out = step(events, now)
        dt = time.perf_counter() - t0
        if any(type(d).__name__ == "Bind" for d in out):
            binds.append(dt)
        return out

    plane.scheduler.step = timed_step  # type: ignore[method-assign]
    plane.start()
    try:
        cmd = ["sleep", str(job_s)]
        t0 = time.time()
        ids = [
            plane.submit(SubmitRequest(command=cmd, gpus=g, replicas=r), ADMIN).job_id
            for g, r in jobs
        ]
        _wait(plane, ids, limit_s=len(jobs) * job_s + 300)
        names = [n.name for n in plane.cluster.nodes]
        member_node = {}
        for jid in ids:
            att = plane.attempts(jid)[-1]
            for rank, a in enumerate(att.assignments):
                member_node[(jid, rank)] = names[int(a["node"])]
        runs = [
            joblogs.Run(
                r.job, r.attempt, r.rank, r.device, member_node[(r.job, r.rank)], r.start, r.end
            )
            for r in joblogs.process_runs(plane.data_dir)
            if (r.job, r.rank) in member_node
        ]
        makespan = max(r.end for r in runs) - t0
        lat = []
        for _ in range(probes):
            ts = time.time()
            jid = plane.submit(SubmitRequest(command=["true"], gpus=1), ADMIN).job_id
            _wait(plane, [jid], 30)
            started = started_file(plane.log_path(jid, 1).parent, 0)
            lat.append(json.loads(started.read_text())["exec_unix"] - ts)
    finally:
        plane.close(kill_jobs=True)
    return {
        "makespan_s": makespan,
        "gpu_used_twice": joblogs.max_per_device(runs) > 1,
        "placement_ms_p50": p50(binds) * 1000,
        "placement_ms_max": max(binds, default=0) * 1000,
        "start_latency_ms_p50": p50(lat) * 1000,
        "attempts_over_1": sum(len(plane.attempts(j)) > 1 for j in ids),
    }


def _wait(plane: ControlPlane, ids: list[str], limit_s: float) -> None:
    end = time.monotonic() + limit_s
    want = set(ids)
    while time.monotonic() < end:
        rows = [r for r in plane.jobs(ADMIN, limit=100_000) if r.id in want]
        if all(r.state in (st.DONE, st.FAILED) for r in rows):
            bad = [r.id for r in rows if r.state == st.FAILED]
            if bad:
                raise SystemExit(f"gpufence jobs failed: {bad[:5]}")
            return
        time.sleep(0.1)
    raise SystemExit("timed out waiting for the gpufence jobs")


# ---------------------------------------------------------------------- Ray alone
@ray.remote
def _sleep_task(seconds: float) -> dict[str, Any]:
    t = time.time()
    ctx = ray.get_runtime_context()
    gpus = [str(g) for g in ray.get_gpu_ids()]
    time.sleep(seconds)
    return {"node": ctx.get_node_id(), "gpus": gpus, "start": t, "end": time.time()}


def _ray_job(n: int, job_s: float) -> tuple[Any, list[Any]]:
    pg = placement_group([{"GPU": 1}] * n, strategy="PACK")
    refs = [
        _sleep_task.options(
            num_gpus=1,
            num_cpus=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=i
            ),
        ).remote(job_s)
        for i in range(n)
    ]
    return pg, refs


def run_ray(jobs: list[tuple[int, int]], job_s: float, probes: int) -> dict[str, Any]:
    t0 = time.time()
    owner: dict[Any, int] = {}
    groups: dict[int, tuple[Any, list[Any]]] = {}
    for k, (g, r) in enumerate(jobs):
        pg, refs = _ray_job(g * r, job_s)
        groups[k] = (pg, refs)
        for ref in refs:
            owner[ref] = k
    left = dict.fromkeys(groups, 0)
    for k, (_pg, refs) in groups.items():
        left[k] = len(refs)
    recs: list[dict[str, Any]] = []
    pending = list(owner)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=None)
        for ref in ready:
            recs.append(ray.get(ref))
            k = owner[ref]
            left[k] -= 1
            if left[k] == 0:
                remove_placement_group(groups[k][0])
    makespan = max(r["end"] for r in recs) - t0
    by_gpu: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for r in recs:
        for gid in r["gpus"]:
            by_gpu[(r["node"], gid)] += [(r["start"], 1), (r["end"], -1)]
    worst = 0
    for pts in by_gpu.values():
        live = 0
        for _t, d in sorted(pts):
            live += d
            worst = max(worst, live)
    lat = []
    for _ in range(probes):
        ts = time.time()
        pg, refs = _ray_job(1, 0.0)
        lat.append(ray.get(refs[0])["start"] - ts)
        remove_placement_group(pg)
    return {
        "makespan_s": makespan,
        "gpu_used_twice": worst > 1,
        "start_latency_ms_p50": p50(lat) * 1000,
        "tasks": len(recs),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--job-s", type=float, default=2.0)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--probes", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-ray", action="store_true", help="skip the plain-Ray comparison")
    args = ap.parse_args()
    jobs = workload(args.jobs, args.seed)
    total = args.nodes * args.gpus
    ideal = sum(g * r for g, r in jobs) * args.job_s / total
    nodes = [
        LocalNode(gpus=args.gpus, cpus=args.gpus, resources={f"rack:rack-{i % 2}": 1})
        for i in range(args.nodes)
    ]
    with local_ray_cluster(nodes):
        with tempfile.TemporaryDirectory(prefix="gpufence-ray-gang-") as tmp:
            gf = run_gpufence(jobs, args.job_s, args.probes, Path(tmp))
        print(json.dumps({"ideal_s": round(ideal, 2), "gpufence": gf}), file=sys.stderr)
        if not args.skip_ray:
            rp = run_ray(jobs, args.job_s, args.probes)
            print(json.dumps({"ray_pg": rp}), file=sys.stderr)
            print(
                f"ray_pg_makespan_over_ideal={rp['makespan_s'] / ideal:.3f} "
                f"ray_pg_start_latency_ms_p50={rp['start_latency_ms_p50']:.1f} "
                f"ray_pg_gpu_used_twice={int(rp['gpu_used_twice'])}"
            )
    print(
        f"makespan_over_ideal={gf['makespan_s'] / ideal:.3f} "
        f"placement_ms_p50={gf['placement_ms_p50']:.2f} "
        f"start_latency_ms_p50={gf['start_latency_ms_p50']:.1f}"
    )
    return 1 if gf["gpu_used_twice"] else 0


if __name__ == "__main__":
    sys.exit(main())
