"""Before/after table of a ``gpufence sim`` comparison over seeds: mean [95 % interval].

``--before`` takes one ``metrics.json`` per seed (e.g. runs of an older checkout with
``--seed N``); ``--after`` one ``metrics.json`` written with ``--seeds`` (its ``by_seed``), or
several single-seed files. A figure missing on one side (the older code did not measure it)
prints as "-". Intervals: ``gpufence.telemetry.distribution.mean_ci95`` (Student t).

    PYTHONPATH=src python bench/sim_compare.py --before old/seed*/metrics.json \\
        --after out/metrics.json [--markdown]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from gpufence.sim.headline import figure
from gpufence.telemetry.distribution import mean_ci95

ROWS = (
    ("serving SLO attainment", "serving.slo_attainment", 1.0, "{:.4f}"),
    ("requests within SLO", "serving.requests_within_slo", 1.0, "{:.4f}"),
    ("serving p99 ms (before: p99 of window p99s)", "serving.p99_ms", 1.0, "{:.0f}"),
    ("worst window p99 ms", "serving.worst_window_p99_ms", 1.0, "{:.0f}"),
    ("windows short of replicas", "serving.services.chat.windows_short_of_replicas", 1.0, "{:.0f}"),
    ("training wait p50 h (started)", "queue_delay_s.training.p50", 1 / 3600, "{:.2f}"),
    ("training wait p99 h (started)", "queue_delay_s.training.p99", 1 / 3600, "{:.1f}"),
    ("training wait p99 h (all, censored)", "queue_delay_all_s.training.p99", 1 / 3600, "{:.1f}"),
    (
        "training jobs still waiting at the horizon",
        "queue_delay_all_s.training.censored",
        1.0,
        "{:.0f}",
    ),
    ("training JCT p50 h (completed)", "jct_s.training.p50", 1 / 3600, "{:.2f}"),
    ("training JCT p50 h (all, censored)", "jct_all_s.training.p50", 1 / 3600, "{:.2f}"),
    ("jobs completed", "completed", 1.0, "{:.0f}"),
    ("preemptions", "preemptions.count", 1.0, "{:.1f}"),
    ("GPU-hours lost (after: node failures included)", "preemptions.gpu_hours_lost", 1.0, "{:.1f}"),
    ("reclaims", "reclaims.count", 1.0, "{:.0f}"),
    ("GPU allocation", "gpu.allocation_ratio", 1.0, "{:.3f}"),
    ("GPU fragmentation", "gpu.fragmentation", 1.0, "{:.3f}"),
    ("busiest node uplink", "interconnect.node_uplink.max", 1.0, "{:.2f}"),
    ("rack uplink p95", "interconnect.rack_uplink.p95", 1.0, "{:.2f}"),
)


def per_seed(paths: list[Path]) -> list[dict[str, Any]]:
    """One ``{"policies": ...}`` object per seed."""
    out: list[dict[str, Any]] = []
    for p in paths:
        m = json.loads(p.read_text())
        if "by_seed" in m:
            out += [
                {"policies": v} for _, v in sorted(m["by_seed"].items(), key=lambda kv: int(kv[0]))
            ]
        else:
            out.append(m)
    return out


def cell(runs: list[dict[str, Any]], policy: str, path: str, scale: float, fmt: str) -> str:
    vals = [figure(r["policies"].get(policy, {}), path) for r in runs]
    if not vals or any(v is None for v in vals):
        return "-"
    nums = [float(v) * scale for v in vals if v is not None]
    if any(math.isinf(v) for v in nums):
        return "overload"
    iv = mean_ci95(nums)
    if iv.n == 1:
        return fmt.format(iv.mean)
    return f"{fmt.format(iv.mean)} [{fmt.format(iv.low)}, {fmt.format(iv.high)}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", nargs="+", type=Path, required=True)
    ap.add_argument("--after", nargs="+", type=Path, required=True)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    before, after = per_seed(args.before), per_seed(args.after)
    policies = list(after[0]["policies"])
    print(f"before: {len(before)} seeds, after: {len(after)} seeds; mean [95 % interval]")
    for pol in policies:
        print(f"\n{pol}" if not args.markdown else f"\n**{pol}**\n")
        if args.markdown:
            print("| figure | before | after |\n|---|---|---|")
        for label, path, scale, fmt in ROWS:
            b = cell(before, pol, path, scale, fmt)
            a = cell(after, pol, path, scale, fmt)
            if b == a == "-":
                continue
            print(f"| {label} | {b} | {a} |" if args.markdown else f"  {label:48s} {b:28s} {a}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
