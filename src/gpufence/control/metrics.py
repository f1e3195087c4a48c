"""Prometheus metrics of the control plane: the counters and histograms that move as things
happen, and the GPU hand-off gaps the demo reports.

Counters and histograms are updated by the reconciler (binds, stops, rejects, cycles) and by
the store's observers (every job state change: outcomes, time in state). Gauges that describe
live state are read at scrape time (``observe/prom_collectors.py``), so they are never stale and
cost nothing between scrapes. One registry per control plane: tests run several in one process.
Every metric's name, labels and help come from ``gpufence.telemetry.measures``; what each
measure means (and which stop reasons are preemptions or reclaims) is defined once in
``gpufence.telemetry``, shared with the simulator's metrics.json. ``*_created`` series are off.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.registry import Collector

from gpufence.control.base.executor import Launch
from gpufence.control.store.database import TERMINAL, StateChange
from gpufence.model.cluster import Cluster
from gpufence.telemetry.delays import attempt_wait_s
from gpufence.telemetry.incidents import PREEMPTION_REASONS, RECLAIM_REASONS
from gpufence.telemetry.measures import measure

__all__ = ["PREEMPTION_REASONS", "RECLAIM_REASONS", "Telemetry"]
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # process-wide: no *_created series anywhere

_DELAY_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
_HANDOFF_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
_CYCLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
OUTCOMES = ("done", "failed", "cancelled", "reclaimed", "rejected")
TIMED_STATES = ("pending", "starting", "running", "stopping")


def _counter(name: str, r: CollectorRegistry) -> Counter:
    m = measure(name)
    return Counter(m.base, m.help, list(m.labels), registry=r)


def _histogram(name: str, r: CollectorRegistry, buckets: Iterable[float]) -> Histogram:
    m = measure(name)
    return Histogram(m.base, m.help, list(m.labels), buckets=tuple(buckets), registry=r)


class Telemetry:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock  # the reconciler's, once there is one (time in state)
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_delay = _histogram("gpufence_queue_delay_seconds", r, _DELAY_BUCKETS)
        self.state_time = _histogram("gpufence_job_state_seconds", r, _DELAY_BUCKETS)
        self.handoff = _histogram("gpufence_gpu_handoff_seconds", r, _HANDOFF_BUCKETS)
        self.cycle_time = _histogram(
            "gpufence_scheduling_cycle_duration_seconds", r, _CYCLE_BUCKETS
        )
        self.submitted_total = _counter("gpufence_jobs_submitted_total", r)
        self.rejected_total = _counter("gpufence_jobs_rejected_total", r)
        self.finished_total = _counter("gpufence_jobs_finished_total", r)
        self.admitted_total = _counter("gpufence_queue_admitted_jobs_total", r)
        self.preemptions = _counter("gpufence_preemptions_total", r)
        self.reclaims = _counter("gpufence_reclaims_total", r)
        self.stops = _counter("gpufence_stops_total", r)
        self.mig_reconfigures = _counter("gpufence_mig_reconfigures_total", r)
        self.foreign_processes = _counter("gpufence_foreign_gpu_process_incidents_total", r)
        self.mps_restarts = _counter("gpufence_mps_daemon_restarts_total", r)
        self._released: dict[tuple[str, str], float] = {}  # (node, device) -> exit seen at
        self._exit_seen: dict[tuple[str, int], float] = {}
        # the most recent gaps, for the demo summary (bounded: a server runs for months)
        self.handoffs: deque[float] = deque(maxlen=10_000)
        self._since: dict[str, tuple[str, float]] = {}  # job id -> (state, entered at)
        self._submitted: dict[str, Counter] = {}  # class -> its child of submitted_total
        self._lock = threading.Lock()
        self._waits: dict[str, list[float]] = {}  # class -> waits of the starts since drained

    def add_collector(self, c: Collector) -> None:
        self.registry.register(c)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def prime(self, cluster: Cluster) -> None:
        """Every queue's counters at 0 from the start, so ``rate()`` sees their first
        increment and a dashboard never shows "No data" for a quiet queue."""
        for name, part in cluster.partitions.items():
            for q in cluster.partition_queues[name]:
                for cls in sorted(str(c) for c in part.admits):
                    lab = {"partition": name, "queue": q, "class": cls}
                    self.admitted_total.labels(**lab)
                    for outcome in OUTCOMES:
                        self.finished_total.labels(**lab, outcome=outcome)
        for reason in PREEMPTION_REASONS:
            self.preemptions.labels(reason)
        for reason in RECLAIM_REASONS:
            self.reclaims.labels(reason)

    # ------------------------------------------------------------------ events
    def submitted(self, cls: str) -> None:
        self.submitted_counter(cls).inc()

    def submitted_counter(self, cls: str) -> Counter:
        """The submitted-jobs counter of one class (looked up once: every submit counts)."""
        child = self._submitted.get(cls)
        if child is None:
            child = self._submitted[cls] = self.submitted_total.labels(cls)
        return child

    def rejected(self, reason: str) -> None:
        self.rejected_total.labels(reason).inc()

    def bound(self, partition: str, cls: str, queue: str, delay_s: float) -> None:
        wait = attempt_wait_s(0.0, delay_s)
        lab = {"partition": partition, "queue": queue, "class": cls}
        self.queue_delay.labels(**lab).observe(wait)
        self.admitted_total.labels(**lab).inc()
        with self._lock:
            self._waits.setdefault(cls, []).append(wait)

    def drain_waits(self) -> dict[str, list[float]]:
        """Queue delays of the attempts started since the last call, per class (the series)."""
        with self._lock:
            out, self._waits = self._waits, {}
        return out

    def cycle_done(self, seconds: float) -> None:
        self.cycle_time.observe(seconds)

    def state_changes(self, changes: list[StateChange]) -> None:
        """A store observer: job outcomes, and the time each job spent in the state it left
        (after a restart, a state entered before it counts from submit / start)."""
        now = self.clock()
        for c in changes:
            ended, timed = c.new in TERMINAL, c.old in TIMED_STATES
            if ended or timed:  # not a new job's first state (a submit: the usual change)
                lab = {"partition": c.partition, "queue": c.queue, "class": c.workload_class}
                if ended:
                    self.finished_total.labels(**lab, outcome=c.new).inc()
                entered = self._entered(c) if timed else None
                if entered is not None:
                    self.state_time.labels(state=c.old, **lab).observe(max(0.0, now - entered))
            if ended:
                self._since.pop(c.job_id, None)
            else:
                self._since[c.job_id] = (c.new, now)

    def _entered(self, c: StateChange) -> float | None:
        known = self._since.get(c.job_id)
        if known is not None and known[0] == c.old:
            return known[1]
        if c.old == "pending":
            return c.submitted_at
        if c.old in ("starting", "running"):
            return c.started_at
        return None

    def exit_seen(self, job_id: str, attempt: int, t: float) -> None:
        """Called from the executor's thread the moment an attempt's exit is known."""
        self._exit_seen[(job_id, attempt)] = t

    def released(self, launch: Launch) -> None:
        t = self._exit_seen.pop((launch.job_id, launch.attempt), None)
        if t is None:
            return
        for m in launch.members:
            for dev in m.devices:
                self._released[(m.node, dev)] = t

    def started(self, launch: Launch, t: float) -> None:
        """The next job's processes are spawned: the control plane's share of a hand-off."""
        for m in launch.members:
            for dev in m.devices:
                freed = self._released.pop((m.node, dev), None)
                if freed is not None:
                    gap = max(0.0, t - freed)
                    self.handoff.observe(gap)
                    self.handoffs.append(gap)

    def mig_reconfigured(self, ok: bool) -> None:
        self.mig_reconfigures.labels("ok" if ok else "failed").inc()

    def foreign_process(self, gpu_index: int) -> None:
        self.foreign_processes.labels(str(gpu_index)).inc()

    def mps_restarted(self, gpu_index: int) -> None:
        self.mps_restarts.labels(str(gpu_index)).inc()

    def stopped(self, reason: str, requeue: bool) -> None:
        self.stops.labels(reason).inc()
        if reason in PREEMPTION_REASONS:
            self.preemptions.labels(reason).inc()
        elif reason in RECLAIM_REASONS:
            self.reclaims.labels(reason).inc()
