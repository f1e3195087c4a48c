"""Prometheus metrics of the control plane, and the GPU hand-off gaps the demo reports.

Counters and histograms are updated by the reconciler as things happen. Gauges that describe
live state (jobs pending/running, GPUs per partition, largest placeable gang) are read at scrape
time from the reconciler thread (``views.gauges``), so they are never stale and cost nothing
between scrapes. One registry per control plane: tests run several in one process.
What each measure means (and which stop reasons are preemptions or reclaims) is defined once in
``gpufence.telemetry``, shared with the simulator's metrics.json.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpufence.control.executors.interface import Launch
from gpufence.telemetry.capacity import allocation_ratio
from gpufence.telemetry.delays import attempt_wait_s
from gpufence.telemetry.incidents import PREEMPTION_REASONS, RECLAIM_REASONS

__all__ = ["PREEMPTION_REASONS", "RECLAIM_REASONS", "Telemetry"]
_DELAY_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
_HANDOFF_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)


class _LiveGauges(Collector):
    def __init__(self, read: Callable[[], dict[str, Any] | None]) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        data = self._read()
        if data is None:
            return
        jobs = GaugeMetricFamily(
            "gpufence_jobs", "Jobs pending or running", labels=["state", "partition", "class"]
        )
        for (state, part, cls), n in sorted(data["jobs"].items()):
            jobs.add_metric([state, part, cls], n)
        yield jobs
        gpus = GaugeMetricFamily(
            "gpufence_partition_gpus",
            "GPUs of a partition: capacity, used (GPU-equivalents), lent out, borrowed",
            labels=["partition", "kind"],
        )
        gang = GaugeMetricFamily(
            "gpufence_largest_placeable_gang_gpus",
            # telemetry.capacity.largest_placeable_gang
            "Whole GPUs the largest single-node gang could get now (fragmentation)",
            labels=["partition"],
        )
        alloc = GaugeMetricFamily(
            "gpufence_gpu_allocation_ratio", "used / capacity per partition", labels=["partition"]
        )
        for p in data["partitions"]:
            name = p["name"]
            for kind in ("capacity", "used", "lent", "borrowed"):
                gpus.add_metric([name, kind], float(p[f"{kind}_gpus"]))
            gang.add_metric([name], float(p["largest_gang"]))
            cap = p["capacity_gpus"]
            alloc.add_metric([name], allocation_ratio(p["used_gpus"], cap))
        yield gpus
        yield gang
        yield alloc
        yield from _gpu_gauges(data)


def _gpu_gauges(data: dict[str, Any]) -> Iterator[GaugeMetricFamily]:
    """Per-GPU series from the GPU board (real GPUs): labelled by UUID to join DCGM's."""
    foreign = GaugeMetricFamily(
        "gpufence_foreign_gpu_processes",
        "Processes on a GPU that belong to no job holding it, in the last sample",
        labels=["gpu", "uuid"],
    )
    util = GaugeMetricFamily(
        "gpufence_gpu_utilization",
        "NVML GPU utilisation (0..1), last sample",
        labels=["gpu", "uuid"],
    )
    refused = GaugeMetricFamily(
        "gpufence_gpu_refused",
        "1 where gpufence places no work on the GPU (e.g. its MIG mode does not match)",
        labels=["gpu", "uuid"],
    )
    for g in data.get("gpu_notes", []):
        labels = [str(g["index"]), str(g.get("uuid", ""))]
        foreign.add_metric(labels, float(len(g.get("foreign", []))))
        refused.add_metric(labels, 1.0 if g.get("refused") else 0.0)
        if "utilization" in g:
            util.add_metric(labels, float(g["utilization"]))
    yield foreign
    yield util
    yield refused
    enforced = GaugeMetricFamily(
        "gpufence_partition_enforced",
        "1 where the partition's sharing is enforced on the device (MPS for fractional)",
        labels=["partition", "sharing"],
    )
    for p in data["partitions"]:
        if "enforced" in p:
            enforced.add_metric([p["name"], p["sharing"]], 1.0 if p["enforced"] else 0.0)
    yield enforced


class Telemetry:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_delay = Histogram(
            "gpufence_queue_delay_seconds",
            "Submit (or requeue) to start",
            ["partition", "class"],
            buckets=_DELAY_BUCKETS,
            registry=r,
        )
        self.handoff = Histogram(
            "gpufence_gpu_handoff_seconds",
            "A GPU's release (process exit seen) to the next job's processes spawned on it",
            buckets=_HANDOFF_BUCKETS,
            registry=r,
        )
        self.submitted_total = Counter(
            "gpufence_submitted", "Jobs submitted", ["class"], registry=r
        )
        self.rejected_total = Counter(
            "gpufence_rejected", "Jobs rejected at submit", ["reason"], registry=r
        )
        self.preemptions = Counter(
            "gpufence_preemptions", "Checkpointable jobs preempted", ["reason"], registry=r
        )
        self.reclaims = Counter(
            "gpufence_reclaims", "Capacity taken back (lent, idle)", ["reason"], registry=r
        )
        self.stops = Counter("gpufence_stops", "Stops by reason", ["reason"], registry=r)
        self.mig_reconfigures = Counter(
            "gpufence_mig_reconfigures",
            "MIG re-partitions carried out on a GPU, by result (ok, failed)",
            ["result"],
            registry=r,
        )
        self.foreign_processes = Counter(
            "gpufence_foreign_gpu_process_incidents",
            "Processes seen on a GPU that belonged to no job holding it",
            ["gpu"],
            registry=r,
        )
        self.mps_restarts = Counter(
            "gpufence_mps_daemon_restarts",
            "MPS control daemons restarted after dying",
            ["gpu"],
            registry=r,
        )
        self._released: dict[tuple[str, str], float] = {}  # (node, device) -> exit seen at
        self._exit_seen: dict[tuple[str, int], float] = {}
        # the most recent gaps, for the demo summary (bounded: a server runs for months)
        self.handoffs: deque[float] = deque(maxlen=10_000)
        self._live: Callable[[], dict[str, Any] | None] = lambda: None
        r.register(_LiveGauges(lambda: self._live()))

    def set_live(self, read: Callable[[], dict[str, Any] | None]) -> None:
        self._live = read

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ------------------------------------------------------------------ events
    def submitted(self, cls: str) -> None:
        self.submitted_total.labels(cls).inc()

    def rejected(self, reason: str) -> None:
        self.rejected_total.labels(reason).inc()

    def bound(self, partition: str, cls: str, delay_s: float) -> None:
        self.queue_delay.labels(partition, cls).observe(attempt_wait_s(0.0, delay_s))

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
