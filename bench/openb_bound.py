"""Ceiling on the openb allocation any place-it-if-it-fits policy can reach (the FGD protocol).

For each seed, the same arrival sequence ``bench/openb.py`` replays, and
``gpufence.sim.workloads.openb_bound.allocation_ceiling`` on it: the share above half a GPU
(openb's 810 milli) that every such policy must place until one fails leaves a hole only rare
small shares fit. Prints the ceiling per seed and per workload (``all`` = every workload in the
trace folder), last ``alloc_ceiling_pct=X`` (mean over seeds, of the last workload).

    PYTHONPATH=src python bench/openb_bound.py --workload default
    PYTHONPATH=src python bench/openb_bound.py --workload all --seeds 42..51
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from gpufence.model.job import MILLI_PER_GPU
from gpufence.sim.workloads.openb import arrivals, load_nodes, load_pods, resolve_csv
from gpufence.sim.workloads.openb_bound import allocation_ceiling
from openb import TRACES, seeds_arg  # bench/openb.py: the same trace folder and --seeds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="default", help="name, CSV path, or 'all'")
    ap.add_argument("--seeds", type=seeds_arg, default=seeds_arg("42..51"))
    ap.add_argument("--tune", type=float, default=1.3)
    ap.add_argument("--nodes", default="gpu_node", help="node-list name or CSV path")
    ap.add_argument("--traces", type=Path, default=TRACES, help="shared/traces folder")
    args = ap.parse_args(argv)
    trace_dir = args.traces / "alibaba-gpu-v2023"
    try:
        nodes = load_nodes(resolve_csv(args.nodes, trace_dir, "node"))
        names = (
            sorted(p.stem.removeprefix("openb_pod_list_") for p in trace_dir.glob("openb_pod_*"))
            if args.workload == "all"
            else [args.workload]
        )
        workloads = [(w, load_pods(resolve_csv(w, trace_dir, "pod"))) for w in names]
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cap = sum(n.gpus for n in nodes) * MILLI_PER_GPU
    print("| workload | ceiling % (mean) | min | max |\n|---|---|---|---|")
    mean = float("nan")
    for name, pods in workloads:
        vals = [
            100.0 * allocation_ceiling(arrivals(pods, args.tune, cap, s), cap) / cap
            for s in args.seeds
        ]
        mean = float(np.mean(vals))
        print(f"| {name} | {mean:.2f} | {min(vals):.2f} | {max(vals):.2f} |", flush=True)
    print(f"alloc_ceiling_pct={mean:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
