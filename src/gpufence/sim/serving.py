"""Serving in the simulator: demand curve -> autoscaler inside the fence -> p99 per window.

Every ``autoscale_every_s`` the fleet (1) scores the window that just ended: the request rate,
the replicas actually running, their service time inflated by contention, and the p99 response
from the Erlang C model (sim.latency); (2) sets the replica target to keep per-replica
utilisation at ``target_utilization`` within [min, max] and submits or cancels replica jobs.
Replica jobs are ordinary serving jobs: the scheduler places them inside the fence (or, under
other policies, wherever the policy lets it), so a full fence shows up as replicas pending and
a p99 that leaves the SLO.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufence.model.events import Event
from gpufence.model.job import GpuRequest, Job, WorkloadClass
from gpufence.model.lifecycle import JobState
from gpufence.sim.contention import Contention
from gpufence.sim.latency import INF, p99_response_s
from gpufence.sim.runner import Simulation, WorkItem
from gpufence.sim.scenario import Demand, Service


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
    start: float
    end: float
    rate_rps: float
    replicas: int  # running during the window
    target: int
    p99_ms: float
    inflation: float


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

    def first_wake(self) -> float | None:
        return 0.0

    def desired(self, t: float) -> int:
        s = self.svc
        need = math.ceil(self.rate(t) * s.service_ms / 1000.0 / s.target_utilization)
        return max(s.min_replicas, min(s.max_replicas, need))

    def wake(self, now: float, sim: Simulation) -> tuple[list[Event], float | None]:
        self._score(now, sim)
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
        return WorkItem(job, self.horizon_s * 10, ack_after_s=None)

    def _score(self, now: float, sim: Simulation) -> None:
        """Latency of the window [last wake, now) with the replicas running at its start."""
        if now <= self._last and self.windows:
            return
        start = self._last
        s = self.svc
        ledger = sim.scheduler.ledger
        running = [j for j in self._alive if sim.jobs[j].state is JobState.RUNNING]
        fab = self.contention.fabric
        rack_util = fab.rack_utilization(ledger) if running else {}
        node_load = fab.node_load_gbps(ledger) if running else {}
        exp = [self.contention.replica_exposure(ledger, j, rack_util, node_load) for j in running]
        # requests spread evenly over replicas: average the mean stretch and the extra variance
        inflation = sum(e.mean_factor for e in exp) / len(exp) if exp else 1.0
        extra_cv2 = sum(e.extra_cv2 for e in exp) / len(exp) if exp else 0.0
        cv = math.sqrt(s.service_cv**2 + extra_cv2)
        mid = start + (now - start) / 2 if now > start else now
        rate = self.rate(mid)
        p99 = p99_response_s(len(running), rate, s.service_ms / 1000.0 * inflation, cv)
        if now > start:
            self.windows.append(
                Window(
                    start,
                    now,
                    rate,
                    len(running),
                    self.desired(start),
                    p99 * 1000.0 if p99 != INF else INF,
                    inflation,
                )
            )
        self._last = now

    # ------------------------------------------------------------------ results
    def attainment(self) -> float:
        """Fraction of requests served in windows whose p99 met the SLO."""
        total = sum(w.rate_rps * (w.end - w.start) for w in self.windows)
        if total <= 0:
            return 1.0
        good = sum(
            w.rate_rps * (w.end - w.start) for w in self.windows if w.p99_ms <= self.svc.slo_p99_ms
        )
        return good / total

    def p99_overall_ms(self) -> float:
        """Request-weighted p99 of the per-window p99s (inf when overloaded windows dominate)."""
        pairs = sorted((w.p99_ms, w.rate_rps * (w.end - w.start)) for w in self.windows)
        total = sum(wt for _, wt in pairs)
        if total <= 0:
            return 0.0
        acc = 0.0
        for p, wt in pairs:
            acc += wt
            if acc >= 0.99 * total:
                return p
        return pairs[-1][0]
