"""Percentiles of a sample and the mean of a figure over seeds with its 95 % interval."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# two-sided 95 % Student-t quantiles t_{0.975, df} for df = 1..30 (standard table); beyond 30
# the normal 1.96 is within 2 % of the exact value
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (numpy's linear interpolation); 0 for no values."""
    return float(np.percentile(np.asarray(values, dtype=float), p)) if len(values) else 0.0


def percentiles(
    values: Sequence[float], which: tuple[int, ...] = (50, 95, 99), digits: int = 3
) -> dict[str, float]:
    """``{"p50": .., "p95": .., "p99": .., "max": ..}`` rounded to ``digits``; zeros when empty."""
    if not len(values):
        return {f"p{p}": 0.0 for p in which} | {"max": 0.0}
    arr = np.asarray(values, dtype=float)
    out = {f"p{p}": round(float(np.percentile(arr, p)), digits) for p in which}
    out["max"] = round(float(arr.max()), digits)
    return out


def t95(df: int) -> float:
    """Two-sided 95 % Student-t quantile for ``df`` degrees of freedom."""
    if df < 1:
        return math.inf
    return _T95[df - 1] if df <= len(_T95) else 1.96


@dataclass(frozen=True, slots=True)
class Interval:
    """Mean of a figure over independent runs (seeds) and its 95 % confidence interval."""

    mean: float
    low: float
    high: float
    n: int

    def as_dict(self, digits: int = 4) -> dict[str, float | int]:
        return {
            "mean": round(self.mean, digits),
            "ci95_low": round(self.low, digits),
            "ci95_high": round(self.high, digits),
            "n": self.n,
        }


def mean_ci95(values: Sequence[float]) -> Interval:
    """Mean ± t_{0.975, n−1}·s/√n; a single value is its own (zero-width) interval. Non-finite
    values (an overloaded p99) make the mean and interval non-finite too."""
    arr = np.asarray(values, dtype=float)
    n = int(arr.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    m = float(arr.mean())
    if n == 1 or not math.isfinite(m):
        return Interval(m, m, m, n)
    half = t95(n - 1) * float(arr.std(ddof=1)) / math.sqrt(n)
    return Interval(m, m - half, m + half, n)
