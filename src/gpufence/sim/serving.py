"""Serving in the simulator: demand curve -> autoscaler inside the fence -> p99 per window.

Every ``autoscale_every_s`` the fleet (1) records the window that just ended: the request rate,
the replicas actually running and their service time stretched by contention (its mean and
CV); (2) sets the replica target to keep per-replica utilisation at ``target_utilization``
within [min, max] and submits or cancels replica jobs. After the run every window is scored at
once with the response-time distribution of its pool (sim.latency: exact M/M/c and M/G/1, M/G/c
approximation): its p99 and the share of its requests within the SLO. A window in which
replicas started or stopped is scored piece by piece, each piece with the replicas running
in it (its requests a mixture of the pieces'): scored with the replicas running at its end, a
window where the fleet grew late counted the new replicas for all of it (issue 33, item 11).
Replica jobs are ordinary serving jobs: the scheduler places them inside the fence (or, under
other policies, wherever the policy lets it), so a full fence shows up as replicas pending and
a p99 that leaves the SLO.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufence.model.events import Event
from gpufence.model.job import GpuRequest, Job, WorkloadClass
from gpufence.model.lifecycle import JobState
from gpufence.sim.contention import Contention
from gpufence.sim.latency import (
    INF,
    Pools,
    mixture_quantile,
    window_quantiles,
    window_shares,
)
from gpufence.sim.runner import Occupancy, Simulation
from gpufence.sim.scenario import Demand, Service
from gpufence.sim.workloads.records import WorkItem
from gpufence.telemetry import slo


def diurnal_rate(demand: Demand) -> Callable[[float], float]:
    d = demand.diurnal
    assert d is not None

    def rate(t: float) -> float:
        hour = (t / 3600.0) % 24.0
        dist = min(abs(hour - d.peak_hour), 24.0 - abs(hour - d.peak_hour))
        r = d.base_rps + (d.peak_rps - d.base_rps) * math.exp(-(dist**2) / (2 * d.width_h**2))
        for b in demand.bursts:
            if b.at_s <= t < b.at_s + b.duration_s:
                r *= b.factor
        return r * demand.scale

    return rate


@dataclass(slots=True)
class Window:
    """One scoring window of a service: what ran, and (after ``Fleet.score``) its latency."""

    start: float
    end: float
    rate_rps: float
    replicas: int  # running at the window's end
    target: int
    service_s: float  # mean service time, contention included
    service_cv: float  # contention's extra variance included
    inflation: float
    p99_ms: float = math.nan  # filled by Fleet.score
    within_slo: float = math.nan  # share of the window's requests answered within the SLO
    # (seconds, replicas running) of each piece of the window, in order; () = all of it with
    # ``replicas``
    pieces: tuple[tuple[float, int], ...] = ()

    def spans(self) -> tuple[tuple[float, int], ...]:
        return self.pieces or ((self.end - self.start, self.replicas),)

    @property
    def requests(self) -> float:
        return self.rate_rps * (self.end - self.start)


@dataclass
class Fleet:
    """One autoscaled serving service (a Controller for the simulator)."""

    svc: Service
    rate: Callable[[float], float]
    horizon_s: float
    contention: Contention
    adapt: Callable[[Job], Job] = lambda j: j
    windows: list[Window] = field(default_factory=list)
    _alive: dict[str, None] = field(default_factory=dict)  # submitted, not cancelled
    _serial: int = 0
    _last: float = 0.0
    _scored: int = 0  # windows[: _scored] have their latency
    _p99_all: tuple[int, float] | None = None  # (windows, run p99 ms) once computed
    _seen_occ: int = 0  # sim.occupancy[: _seen_occ] looked at
    _occ: list[Occupancy] = field(default_factory=list)  # replicas' attempts still open
    _ids: set[str] = field(default_factory=set)  # every replica this fleet submitted

    def first_wake(self) -> float | None:
        return 0.0

    def desired(self, t: float) -> int:
        s = self.svc
        need = math.ceil(self.rate(t) * s.service_ms / 1000.0 / s.target_utilization)
        return max(s.min_replicas, min(s.max_replicas, need))

    def wake(self, now: float, sim: Simulation) -> tuple[list[Event], float | None]:
        self._record(now, sim)
        events: list[Event] = []
        target = self.desired(now)
        live = (JobState.PENDING, JobState.RUNNING)
        self._alive = {j: None for j in self._alive if sim.jobs[j].state in live}
        alive = list(self._alive)
        if target > len(alive):
            for _ in range(target - len(alive)):
                events.append(sim.submit(self._replica(now), now))
        elif target < len(alive):
            # scale in: pending replicas first, then the newest running ones
            pending = [j for j in alive if sim.jobs[j].state is JobState.PENDING]
            running = [j for j in reversed(alive) if sim.jobs[j].state is JobState.RUNNING]
            for jid in (pending + running)[: len(alive) - target]:
                ev = sim.cancel(jid, now)
                self._alive.pop(jid, None)
                if ev is not None:
                    events.append(ev)
        nxt = now + self.svc.autoscale_every_s
        return events, (nxt if nxt < self.horizon_s else None)

    def _replica(self, now: float) -> WorkItem:
        self._serial += 1
        s = self.svc
        job = Job(
            id=f"{s.name}-r{self._serial:05d}",
            workload_class=WorkloadClass.SERVING,
            request=GpuRequest.whole(s.gpus_per_replica),
            queue=s.queue,
            partition=s.partition if not s.queue else "",
            priority=s.priority,
            submit_time=now,
        )
        job = self.adapt(job)
        self._alive[job.id] = None
        self._ids.add(job.id)
        return WorkItem(job, self.horizon_s * 10, ack_after_s=None)

    def _record(self, now: float, sim: Simulation) -> None:
        """The window [last wake, now) with the replicas running at its end (its latency is
        computed later, for all windows at once)."""
        if now <= self._last and self.windows:
            return
        start = self._last
        s = self.svc
        ledger = sim.scheduler.ledger
        running = [j for j in self._alive if sim.jobs[j].state is JobState.RUNNING]
        pieces = self._pieces(start, now, sim)
        exp = self.contention.mean_replica_exposure(ledger, running, s.network_share)
        inflation = exp.mean_factor
        cv = math.sqrt(s.service_cv**2 + exp.extra_cv2)
        mid = start + (now - start) / 2 if now > start else now
        if now > start:
            self.windows.append(
                Window(
                    start,
                    now,
                    self.rate(mid),
                    len(running),
                    self.desired(start),
                    s.service_ms / 1000.0 * inflation,
                    cv,
                    inflation,
                    pieces=pieces if len(pieces) > 1 else (),
                )
            )
        self._last = now

    def _pieces(self, start: float, end: float, sim: Simulation) -> tuple[tuple[float, int], ...]:
        """The window [start, end) cut where one of this fleet's replicas started or stopped:
        (seconds, replicas running) per piece."""
        occ = sim.occupancy
        mine = f"{self.svc.name}-r"
        for o in occ[self._seen_occ :]:
            if o.job_id.startswith(mine) and o.job_id in self._ids:
                self._occ.append(o)
        self._seen_occ = len(occ)
        cuts = {start, end}
        for o in self._occ:
            for t in (o.start, o.end):
                if t is not None and start < t < end:
                    cuts.add(t)
        edges = sorted(cuts)
        out: list[tuple[float, int]] = []
        for a, b in itertools.pairwise(edges):
            n = sum(1 for o in self._occ if o.start <= a and (o.end is None or o.end >= b))
            if out and out[-1][1] == n:
                out[-1] = (out[-1][0] + b - a, n)
            else:
                out.append((b - a, n))
        self._occ = [o for o in self._occ if o.end is None or o.end > end]
        return tuple(out)

    # ------------------------------------------------------------------ results
    def pools(self) -> Pools:
        """One pool per piece of every window, in window order."""
        c: list[int] = []
        lam: list[float] = []
        svc: list[float] = []
        cv: list[float] = []
        for x in self.windows:
            for _, n in x.spans():
                c.append(n)
                lam.append(x.rate_rps)
                svc.append(x.service_s)
                cv.append(x.service_cv)
        return Pools(c, lam, svc, cv)

    def _weights(self) -> tuple[list[int], list[float]]:
        """Per piece: its window's index and its requests."""
        owner: list[int] = []
        weight: list[float] = []
        for i, x in enumerate(self.windows):
            for secs, _ in x.spans():
                owner.append(i)
                weight.append(x.rate_rps * secs)
        return owner, weight

    def score(self) -> list[Window]:
        """Fill in every window's p99 and share of requests within the SLO (vectorised over
        the windows' pieces; a window of several pieces is their request-weighted mixture)."""
        if self._scored < len(self.windows) and self.windows:
            pools = self.pools()
            owner, weight = self._weights()
            p99 = window_quantiles(pools, owner, weight, len(self.windows), 0.99)
            within = window_shares(
                pools, owner, weight, len(self.windows), self.svc.slo_p99_ms / 1000.0
            )
            for w, p, ok in zip(self.windows, p99, within, strict=True):
                w.p99_ms = float(p) * 1000.0 if p != INF else INF
                w.within_slo = float(ok) if w.rate_rps > 0 else 1.0
            self._scored = len(self.windows)
        return self.windows

    def attainment(self) -> float:
        """Share of requests served in windows whose p99 met the SLO (telemetry.slo)."""
        w = self.score()
        return slo.attainment([x.requests for x in w], [x.p99_ms for x in w], self.svc.slo_p99_ms)

    def within_slo(self) -> float:
        """Share of all requests answered within the SLO."""
        w = self.score()
        return slo.within_slo([x.requests for x in w], [x.within_slo for x in w])

    def worst_window_ms(self) -> float:
        w = self.score()
        return slo.worst_window([x.p99_ms for x in w], [x.requests for x in w])

    def p99_overall_ms(self) -> float:
        """p99 of one request's response time over the whole run (the windows' mixture)."""
        if not self.windows:
            return 0.0
        if self._p99_all is None or self._p99_all[0] != len(self.windows):
            q = mixture_quantile(self.pools(), self._weights()[1], 0.99)
            self._p99_all = (len(self.windows), q * 1000.0 if q != INF else INF)
        return self._p99_all[1]
