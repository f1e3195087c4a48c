"""Serving latency per deployment: requests kept as histograms per step, p99 over a sliding
window, SLO attainment over scoring windows.

A **deployment** is the serving jobs of one tenant with the same ``name`` (a job without a name
is a deployment of its own, named by its id): its replicas' requests are pooled, as a load
balancer in front of them would see them. Requests arrive as histograms — the difference of a
replica's cumulative Prometheus buckets between two scrapes, or pushed single latencies binned
(``telemetry.histograms``) — and are added to the **step window** they arrived in
(``series_step_s`` wide; the first source's buckets are the deployment's, later ones are
rebinned onto them). From those:

* **p99** = the 0.99-quantile of the requests of the last ``latency_window_s``;
* **SLO attainment** = ``telemetry.slo.attainment`` over **scoring windows** (the partition's
  ``slo.window_s``, else ``latency_window_s``): the request-weighted share of windows whose p99
  met the SLO, over what the book still holds (``series_retention_s``), the current window
  included;
* **requests** and **slow requests** (slower than the SLO) as counters, for rates and burn.

Memory is bounded: one sparse histogram per deployment per step of the retention; a deployment
with no requests for a whole retention is forgotten. Nothing here survives a restart.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufence.telemetry import histograms as hist
from gpufence.telemetry.slo import attainment


@dataclass(frozen=True, slots=True, order=True)
class DeploymentKey:
    tenant: str
    name: str


@dataclass
class _Deployment:
    partition: str
    slo_s: float | None
    score_s: float
    bounds: tuple[float, ...] | None = None
    steps: OrderedDict[int, dict[int, float]] = field(default_factory=OrderedDict)
    requests_total: float = 0.0
    slow_total: float = 0.0


@dataclass(frozen=True, slots=True)
class DeploymentSummary:
    key: DeploymentKey
    partition: str
    slo_s: float | None
    p99_s: float | None  # over the sliding window; None without requests in it
    attainment: float | None  # None without an SLO or without requests
    requests_total: float
    slow_total: float
    window_requests: float


class LatencyBook:
    def __init__(
        self,
        step_s: float,
        window_s: float,
        retention_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.step_s = step_s
        self.window_s = window_s
        self.retention_s = retention_s
        self.clock = clock
        self._deps: dict[DeploymentKey, _Deployment] = {}
        self._fresh: dict[DeploymentKey, float] = {}  # requests added since take_fresh()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ writing
    def add(
        self,
        key: DeploymentKey,
        partition: str,
        slo_s: float | None,
        h: hist.Histogram,
        t: float | None = None,
        score_s: float | None = None,
    ) -> None:
        """Requests of ``key`` seen at ``t`` (default: now)."""
        hist.check(*h)
        t = self.clock() if t is None else t
        with self._lock:
            dep = self._deps.get(key)
            if dep is None:
                dep = _Deployment(partition, slo_s, score_s or self.window_s)
                self._deps[key] = dep
            dep.partition, dep.slo_s = partition, slo_s
            if score_s is not None:
                dep.score_s = score_s
            if dep.bounds is None:
                dep.bounds = tuple(h[0])
            bounds, counts = hist.rebin(h, dep.bounds)
            step = dep.steps.setdefault(math.floor(t / self.step_s), {})
            for i, c in enumerate(counts):
                if c:
                    step[i] = step.get(i, 0.0) + c
            dep.requests_total += sum(counts)
            self._fresh[key] = self._fresh.get(key, 0.0) + sum(counts)
            if slo_s is not None:
                dep.slow_total += hist.over((bounds, counts), slo_s)
            if len(dep.steps) > 1 and next(reversed(dep.steps)) < next(iter(dep.steps)):
                dep.steps = OrderedDict(sorted(dep.steps.items()))  # a late push
            self._prune(t)

    def _prune(self, now: float) -> None:
        oldest = math.floor((now - self.retention_s) / self.step_s)
        for key in list(self._deps):
            steps = self._deps[key].steps
            while steps and next(iter(steps)) < oldest:
                steps.popitem(last=False)
            if not steps:
                del self._deps[key]

    # ------------------------------------------------------------------ reading
    def take_fresh(self) -> dict[DeploymentKey, float]:
        """Requests added per deployment since the last call (a series point's requests)."""
        with self._lock:
            out, self._fresh = self._fresh, {}
        return out

    def _hist(self, dep: _Deployment, first: int, last: int) -> hist.Histogram:
        assert dep.bounds is not None
        counts = [0.0] * (len(dep.bounds) + 1)
        for s, step in dep.steps.items():
            if first <= s <= last:
                for i, c in step.items():
                    counts[i] += c
        return dep.bounds, tuple(counts)

    def span(self, key: DeploymentKey, start: float, end: float) -> hist.Histogram | None:
        """The requests of the steps from ``start`` up to ``end`` (None: no such deployment)."""
        with self._lock:
            dep = self._deps.get(key)
            if dep is None or dep.bounds is None:
                return None
            return self._hist(dep, math.floor(start / self.step_s), math.floor(end / self.step_s))

    def _attainment(self, dep: _Deployment) -> float | None:
        if dep.slo_s is None or dep.bounds is None or not dep.steps:
            return None
        per = max(1, round(dep.score_s / self.step_s))
        groups: dict[int, list[int]] = {}
        for s in dep.steps:
            groups.setdefault(s // per, []).append(s)
        reqs: list[float] = []
        p99_ms: list[float] = []
        for members in groups.values():
            h = self._hist(dep, min(members), max(members))
            q = hist.quantile(0.99, h)
            if q is not None:
                reqs.append(hist.requests(h))
                p99_ms.append(q * 1000.0)
        return attainment(reqs, p99_ms, dep.slo_s * 1000.0) if reqs else None

    def summaries(self, now: float | None = None) -> list[DeploymentSummary]:
        now = self.clock() if now is None else now
        out = []
        with self._lock:
            self._prune(now)
            first = math.floor((now - self.window_s) / self.step_s)
            last = math.floor(now / self.step_s)
            for key, dep in sorted(self._deps.items()):
                if dep.bounds is None:
                    continue
                h = self._hist(dep, first, last)
                out.append(
                    DeploymentSummary(
                        key,
                        dep.partition,
                        dep.slo_s,
                        hist.quantile(0.99, h),
                        self._attainment(dep),
                        dep.requests_total,
                        dep.slow_total,
                        hist.requests(h),
                    )
                )
        return out
