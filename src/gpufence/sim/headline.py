"""The headline figures of a run and their mean and 95 % interval over seeds.

A figure is named by its path in a policy's ``metrics.json`` object (``serving.slo_attainment``,
``queue_delay_all_s.training.p99``, ...). Over several seeds each figure is summarised by
``telemetry.distribution.mean_ci95`` (Student t, n − 1 degrees of freedom); a figure that is
null in some seed (an overloaded p99) has a null mean and interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpufence.telemetry.distribution import mean_ci95

HEADLINE = (
    "serving.slo_attainment",
    "serving.requests_within_slo",
    "serving.p99_ms",
    "serving.worst_window_p99_ms",
    "queue_delay_s.training.p50",
    "queue_delay_s.training.p99",
    "queue_delay_all_s.training.p50",
    "queue_delay_all_s.training.p99",
    "queue_delay_all_s.training.censored",
    "queue_delay_all_s.all.p99",
    "jct_s.training.p50",
    "jct_all_s.training.p50",
    "completed",
    "pending_at_end",
    "gpu.allocation_ratio",
    "gpu.utilization",
    "gpu.fragmentation",
    "preemptions.count",
    "preemptions.gpu_hours_lost",
    "reclaims.count",
    "interconnect.node_uplink.p95",
    "interconnect.node_uplink.max",
    "interconnect.rack_uplink.p95",
    "interconnect.rack_uplink.max",
)


def figure(m: Mapping[str, Any], path: str) -> float | None:
    """The value at ``path`` (dots) in a metrics object; None when absent; inf when null."""
    cur: Any = m
    for key in path.split("."):
        if not isinstance(cur, Mapping) or key not in cur:
            return None
        cur = cur[key]
    if cur is None:
        return math.inf  # null in metrics.json: an overloaded (unbounded) figure
    return float(cur)


def interval_dict(values: Sequence[float]) -> dict[str, Any]:
    iv = mean_ci95(values).as_dict()
    return {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in iv.items()}


def headline_intervals(
    per_policy: Mapping[str, Sequence[Mapping[str, Any]]], figures: Sequence[str] = HEADLINE
) -> dict[str, dict[str, dict[str, Any]]]:
    """{policy: {figure: {mean, ci95_low, ci95_high, n}}} over one metrics object per seed."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for policy, runs in per_policy.items():
        row: dict[str, dict[str, Any]] = {}
        for f in figures:
            vals = [figure(m, f) for m in runs]
            if any(v is None for v in vals):
                continue
            row[f] = interval_dict([v for v in vals if v is not None])
        out[policy] = row
    return out
