"""The in-memory ring of series points behind ``GET /v1/series``: one point per series step.

A point holds, at its time ``t`` (the end of its step): per serving deployment its requests in
the step, replicas holding GPUs and wanted, the p99 over the latency window ending at ``t`` and
its SLO; per workload class the attempts started in the step with their longest queue delay,
and how long the oldest still-waiting job had waited (the censored side, as the simulator's
joint view draws it); per link (NVLink and PCIe per GPU, each NIC) its throughput and
utilisation; per GPU its utilisation and memory used; the data dir's disk. The ring keeps
``series_retention_s / series_step_s`` points and is lost at a restart: the decision log
(marks) is in the store, and history beyond the ring is Prometheus' job.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from gpufence.control.observe.latency_book import DeploymentKey


@dataclass(frozen=True, slots=True)
class ServingPoint:
    partition: str
    requests: float
    replicas: int
    wanted: int
    p99_ms: float | None
    slo_ms: float | None


@dataclass(frozen=True, slots=True)
class QueuePoint:
    started: int
    max_wait_s: float | None  # None: nothing of the class started in the step
    oldest_wait_s: float  # 0: nothing of the class waits


@dataclass(frozen=True, slots=True)
class LinkPoint:
    node: str
    link: str  # "gpu3" (with link_class nvlink / pcie) or a NIC's name
    link_class: str  # telemetry.interconnect.LIVE_LINK_CLASSES
    gpu: int | None
    bytes_s: float | None  # both directions for NVLink; the busier direction otherwise
    utilization: float | None
    capacity_bytes_s: float | None


@dataclass(frozen=True, slots=True)
class GpuPoint:
    node: str
    gpu: int
    uuid: str
    utilization: float | None
    memory_used_bytes: float | None


@dataclass(frozen=True, slots=True)
class StoragePoint:
    node: str
    device: str
    await_s: float | None
    busy: float


@dataclass(frozen=True, slots=True)
class Point:
    t: float
    serving: dict[DeploymentKey, ServingPoint] = field(default_factory=dict)
    queue: dict[str, QueuePoint] = field(default_factory=dict)
    links: dict[str, LinkPoint] = field(default_factory=dict)  # "node/link/class" -> point
    gpus: dict[str, GpuPoint] = field(default_factory=dict)  # "node/gpu" -> point
    storage: StoragePoint | None = None


class SeriesRing:
    def __init__(self, points: int) -> None:
        self._points: deque[Point] = deque(maxlen=points)
        self._lock = threading.Lock()

    def append(self, p: Point) -> None:
        with self._lock:
            self._points.append(p)

    def between(self, since: float, until: float) -> list[Point]:
        """The points with ``since <= t <= until``, in time order."""
        with self._lock:
            return [p for p in self._points if since <= p.t <= until]

    def oldest(self) -> float | None:
        with self._lock:
            return self._points[0].t if self._points else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._points)
