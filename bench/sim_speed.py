"""Simulator speed: replay 100,000 generated jobs on the 1,000-node example, fenced policy.

The full model is on: re-rating of running jobs when their time-slice neighbours or link load
change, the ring all-reduce fabric model for every multi-GPU gang, per-window serving latency
(exact M/M/c / M/G/c), per-link samples. Prints progress sparsely and, last, one line:
``events_per_s=N wall_s=M jobs=J``. Target: the whole replay in under 60 s on one idle core
(exit code 1 when missed; a loaded machine misses it). ``--profile`` prints the top functions
by cumulative time to stderr.

    PYTHONPATH=src python bench/sim_speed.py [--jobs 100000] [--seed 1] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

from gpufence.sim.generate import generate
from gpufence.sim.policy_run import run_policy
from gpufence.sim.scenario import Scenario
from gpufence.spec import load_cluster

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 60.0


def scenario(jobs: int, seed: int) -> Scenario:
    """About ``jobs`` jobs over a week: mostly training gangs, plus notebooks and batch eval,
    and one serving service autoscaled inside its fence."""
    horizon = 7 * 86400.0
    hours = horizon / 3600.0
    return Scenario.model_validate(
        {
            "name": f"sim-speed-{jobs}",
            "horizon_s": horizon,
            "seed": seed,
            "sample_every_s": 1800,
            "services": [
                {
                    "name": "chat",
                    "queue": "online",
                    "slo_p99_ms": 300,
                    "service_ms": 40,
                    "min_replicas": 64,
                    "max_replicas": 700,
                    "autoscale_every_s": 300,
                    "demand": {"diurnal": {"base_rps": 3000, "peak_rps": 9000}},
                }
            ],
            "training": {
                "arrivals_per_hour": 0.8 * jobs / hours,
                "gang_sizes": {1: 0.4, 2: 0.1, 4: 0.15, 8: 0.2, 16: 0.08, 32: 0.05, 64: 0.02},
                "duration": {"median_s": 1186, "sigma": 1.5, "max_s": 6 * 3600},
                "queues": ["pretrain", "finetune", "research", "product"],
            },
            "notebooks": {"sessions_per_hour": 0.1 * jobs / hours, "mig_profile": "1g.10gb"},
            "batch": {
                "jobs_per_hour": 0.1 * jobs / hours,
                "gpu_fraction": 0.5,
                "gpu_mem_gib": 16,
            },
        }
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    cluster = load_cluster(ROOT / "examples" / "cluster-1000.yaml")
    sc = scenario(args.jobs, args.seed)
    work, events = generate(sc, cluster)
    print(
        f"cluster {cluster.name}: {len(cluster.gpus)} GPUs; workload {len(work)} jobs", flush=True
    )
    last = [time.perf_counter()]

    def progress(t: float) -> None:
        if time.perf_counter() - last[0] > 10:
            last[0] = time.perf_counter()
            print(f"  simulated {t / 86400:.2f} days", flush=True)

    prof = cProfile.Profile() if args.profile else None
    start = time.perf_counter()
    cpu0 = time.process_time()
    if prof is not None:
        prof.enable()
    run = run_policy(sc, cluster, "fenced", work, events, check_invariants=False, progress=progress)
    if prof is not None:
        prof.disable()
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    steps = run.result.steps
    m = run.metrics
    print(
        f"steps {steps}, events {run.result.events}, decisions {len(run.result.log)}, "
        f"completed {m['completed']} of "
        f"{m['submitted']}, serving attainment {m['serving']['slo_attainment']:.4f}",
        flush=True,
    )
    fab = run.timeline.fabric
    print(
        f"model: {run.result.rerates} re-ratings, {len(fab.gangs)} gangs on the fabric at the end,"
        f" interconnect {m['interconnect']}",
        flush=True,
    )
    if prof is not None:
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    print(f"cpu_s={cpu:.1f} (CPU time of this process: less sensitive to a shared machine)")
    print(f"events_per_s={run.result.events / wall:.0f} wall_s={wall:.1f} jobs={m['submitted']}")
    return 0 if wall < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
