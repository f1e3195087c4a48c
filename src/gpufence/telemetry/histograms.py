"""Latency histograms: the p99 of a window of requests and the share of them over an SLO.

A histogram is ``(bounds, counts)``: ``bounds`` the finite upper bounds of its buckets in
seconds, ascending (Prometheus' ``le``), and ``counts`` the requests per bucket — *not*
cumulative — with one more entry than ``bounds``, the ``+Inf`` bucket. The control plane keeps
the requests of a serving deployment this way, whether a replica's own Prometheus histogram
was scraped (``*_request_duration_seconds``: the differences of its cumulative buckets between
two scrapes) or the replica pushed single latencies (binned into ``PUSH_BOUNDS``).

Definitions (the same as Prometheus' ``histogram_quantile`` and the simulator's):

* the **q-quantile** of a window (the p99: ``q = 0.99``) is the latency below which a share
  ``q`` of its requests fall, interpolated linearly inside the bucket it falls in (requests are
  taken as spread evenly across a bucket); the first bucket starts at 0; a quantile in the
  ``+Inf`` bucket is the highest finite bound (a lower bound on the truth); ``None`` with no
  requests;
* the **requests over the SLO** are those above ``slo_s``, with the same interpolation inside
  the bucket holding ``slo_s`` (``telemetry.slo`` judges a window's p99 against the SLO).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence

Histogram = tuple[tuple[float, ...], tuple[float, ...]]


def _log_bounds(low_s: float, high_s: float, ratio: float) -> tuple[float, ...]:
    out = [low_s]
    while out[-1] < high_s:
        out.append(round(out[-1] * ratio, 9))
    return tuple(out)


# 0.1 ms .. ~2 h in steps of 10 %: a pushed latency's p99 is within 5 % of the exact value
PUSH_BOUNDS = _log_bounds(1e-4, 7200.0, 1.1)


def check(bounds: Sequence[float], counts: Sequence[float]) -> None:
    """Raise ValueError unless ``(bounds, counts)`` is a histogram as defined above."""
    if len(counts) != len(bounds) + 1:
        raise ValueError(f"{len(bounds)} bounds need {len(bounds) + 1} counts, got {len(counts)}")
    if any(not math.isfinite(b) or b < 0 for b in bounds):
        raise ValueError("bucket bounds must be finite and non-negative")
    if any(b <= a for a, b in itertools.pairwise(bounds)):
        raise ValueError("bucket bounds must be strictly ascending")
    if any(not math.isfinite(c) or c < 0 for c in counts):
        raise ValueError("bucket counts must be finite and non-negative")


def from_cumulative(les: Sequence[float], cumulative: Sequence[float]) -> Histogram:
    """A histogram from Prometheus' cumulative buckets (``le`` ascending, the last ``+Inf``)."""
    if not les or not math.isinf(les[-1]):
        raise ValueError('a Prometheus histogram ends with its le="+Inf" bucket')
    counts = [cumulative[0]] + [b - a for a, b in itertools.pairwise(cumulative)]
    if any(c < 0 for c in counts):
        raise ValueError("cumulative bucket counts go down")
    return tuple(les[:-1]), tuple(counts)


def binned(latencies_s: Iterable[float], bounds: Sequence[float] = PUSH_BOUNDS) -> Histogram:
    """Single latencies counted into ``bounds`` (a value equal to a bound is in its bucket)."""
    counts = [0.0] * (len(bounds) + 1)
    for v in latencies_s:
        counts[bisect.bisect_left(bounds, v)] += 1
    return tuple(bounds), tuple(counts)


def _lower(bounds: Sequence[float], i: int) -> float:
    return 0.0 if i == 0 else bounds[i - 1]


def rebin(h: Histogram, onto: Sequence[float]) -> Histogram:
    """``h``'s requests counted into the buckets of ``onto``, each source bucket's count split
    in proportion to its overlap with the target buckets (requests spread evenly in a bucket);
    a ``+Inf`` count stays in ``+Inf``."""
    bounds, counts = h
    if tuple(bounds) == tuple(onto):
        return h
    out = [0.0] * (len(onto) + 1)
    for i, c in enumerate(counts):
        if c == 0:
            continue
        if i == len(bounds):
            out[-1] += c
            continue
        lo, hi = _lower(bounds, i), bounds[i]
        if hi <= lo:  # a first bucket of width 0 (le=0)
            out[bisect.bisect_left(onto, hi)] += c
            continue
        for j in range(len(onto) + 1):
            t_lo = _lower(onto, j)
            t_hi = onto[j] if j < len(onto) else math.inf
            overlap = min(hi, t_hi) - max(lo, t_lo)
            if overlap > 0:
                out[j] += c * overlap / (hi - lo)
    return tuple(onto), tuple(out)


def merged(hs: Iterable[Histogram], bounds: Sequence[float]) -> Histogram:
    """The sum of histograms, all rebinned onto ``bounds``."""
    total = [0.0] * (len(bounds) + 1)
    for h in hs:
        for j, c in enumerate(rebin(h, bounds)[1]):
            total[j] += c
    return tuple(bounds), tuple(total)


def requests(h: Histogram) -> float:
    return float(sum(h[1]))


def quantile(q: float, h: Histogram) -> float | None:
    """The q-quantile in seconds (see the module docstring); None with no requests."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    bounds, counts = h
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0.0
    for i, c in enumerate(counts):
        if c > 0 and seen + c >= rank:
            if i == len(bounds):
                return bounds[-1] if bounds else None
            lo, hi = _lower(bounds, i), bounds[i]
            return lo + (hi - lo) * max(0.0, rank - seen) / c
        seen += c
    return bounds[-1] if bounds else None


def over(h: Histogram, slo_s: float) -> float:
    """Requests slower than ``slo_s`` (interpolated inside the bucket holding it)."""
    bounds, counts = h
    slow = 0.0
    for i, c in enumerate(counts):
        lo = _lower(bounds, i)
        hi = bounds[i] if i < len(bounds) else math.inf
        if lo >= slo_s:
            slow += c
        elif hi > slo_s:
            slow += c if math.isinf(hi) else c * (hi - slo_s) / (hi - lo)
    return slow
