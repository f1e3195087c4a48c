"""Serving SLO measures over scoring windows.

The simulator scores a service per window (the autoscaler's interval): its request rate, and
from the latency model the window's p99 and the share of its requests answered within the SLO.

* **SLO attainment** = the share of requests served in windows whose p99 met the SLO (a p99
  SLO is a statement about a window, not about one request);
* **requests within SLO** = the share of all requests answered within the SLO;
* **worst window** = the highest window p99 (not a percentile of window p99s);
* the run's **p99** is the 99th percentile of one request's response time over the whole run
  (the request-weighted mixture of the windows' distributions; ``sim.latency``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def attainment(requests: Sequence[float], p99_ms: Sequence[float], slo_ms: float) -> float:
    """Request-weighted share of windows whose p99 is within ``slo_ms``; 1 with no requests."""
    total = sum(requests)
    if total <= 0:
        return 1.0
    good = sum(r for r, p in zip(requests, p99_ms, strict=True) if p <= slo_ms)
    return good / total


def within_slo(requests: Sequence[float], share_within: Sequence[float]) -> float:
    """Share of all requests answered within the SLO (``share_within`` per window)."""
    total = sum(requests)
    if total <= 0:
        return 1.0
    return sum(r * s for r, s in zip(requests, share_within, strict=True)) / total


def worst_window(p99_ms: Sequence[float], requests: Sequence[float] | None = None) -> float:
    """The highest p99 of a window that served requests (inf when one was overloaded)."""
    vals = [p for i, p in enumerate(p99_ms) if requests is None or requests[i] > 0 or math.isinf(p)]
    return max(vals, default=0.0)
