"""The headline figures of a run and their mean and 95 % interval over seeds.

A figure is named by its path in a policy's ``metrics.json`` object (``serving.slo_attainment``,
``queue_delay_all_s.training.p99``, ...). Over several seeds each figure is summarised by
``telemetry.distribution.mean_ci95`` (Student t, n − 1 degrees of freedom); a figure that is
null in some seed (an overloaded p99) has a null mean and interval. Every headline figure is
non-negative and the shares and utilisations are at most 1: the interval is cut to that range
(a t-interval of attainments 1.0, 1.0, 0.2 reached below 0 and above 1; issue 33, item 11).

The seeds are shared between policies (the same jobs, failures and demand), so policies are
compared by **paired differences** (``paired_differences``): per seed, a policy's figure minus
the baseline policy's, and the mean and 95 % interval of those differences -- far narrower than
two unpaired intervals where the seeds' own variation is large. These are not cut: a
difference may have either sign.
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
    "lending.gpu_hours",
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


# figures that are shares or utilisations: at most 1 (every headline figure is at least 0)
AT_MOST_ONE = frozenset(
    {
        "serving.slo_attainment",
        "serving.requests_within_slo",
        "gpu.allocation_ratio",
        "gpu.utilization",
        "gpu.fragmentation",
        *(f"interconnect.{c}_uplink.{q}" for c in ("node", "rack") for q in ("p95", "max")),
    }
)


def interval_dict(
    values: Sequence[float], low: float = -math.inf, high: float = math.inf
) -> dict[str, Any]:
    """Mean and 95 % interval, the interval cut to [low, high] (the figure's range)."""
    iv = mean_ci95(values).as_dict()
    if math.isfinite(iv["ci95_low"]):
        iv["ci95_low"] = min(max(iv["ci95_low"], low), high)
        iv["ci95_high"] = max(min(iv["ci95_high"], high), low)
    return {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in iv.items()}


def figure_range(path: str) -> tuple[float, float]:
    return 0.0, (1.0 if path in AT_MOST_ONE else math.inf)


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
            row[f] = interval_dict([v for v in vals if v is not None], *figure_range(f))
        out[policy] = row
    return out


def paired_differences(
    per_policy: Mapping[str, Sequence[Mapping[str, Any]]], figures: Sequence[str] = HEADLINE
) -> dict[str, dict[str, dict[str, Any]]]:
    """{policy: {figure: {mean, ci95_low, ci95_high, n}}}: per seed (the runs of each policy
    in the same seed order), the policy's figure minus the first policy's, over the seeds.
    A figure unbounded (overloaded) in some seed of either policy is left out."""
    names = list(per_policy)
    if len(names) < 2:
        return {}
    base = per_policy[names[0]]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for policy in names[1:]:
        row: dict[str, dict[str, Any]] = {}
        for f in figures:
            pairs = [
                (figure(m, f), figure(b, f)) for m, b in zip(per_policy[policy], base, strict=True)
            ]
            diffs = [a - b for a, b in pairs if a is not None and b is not None]
            if len(diffs) == len(pairs) and all(math.isfinite(d) for d in diffs):
                row[f] = interval_dict(diffs)
        out[policy] = row
    return out
