"""The control plane's observer: every series step it scrapes the serving replicas' latency,
then appends one point to the series ring (``series_ring.py``).

``ControlPlane`` holds one. Its thread asks the reconciler thread for the serving state
(``live_view.serving_state``: which replicas run, where to scrape them, the deployments'
replicas and the oldest waits), scrapes, and builds the point from the latency book, the
queue delays of the attempts started in the step (``Telemetry.drain_waits``), the GPU board
(the GPU sampler's counters) and this machine's NIC and disk rates (``hoststats.py``). Pushed
latencies (``POST /v1/jobs/{id}/latency``) go into the same book from API threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from gpufence.control.base.observe_config import TelemetrySettings
from gpufence.control.gpus.board import GpuBoard
from gpufence.control.metrics import Telemetry
from gpufence.control.observe.hoststats import HostStats
from gpufence.control.observe.latency_book import DeploymentKey, LatencyBook
from gpufence.control.observe.latency_scrape import Scraper
from gpufence.control.observe.live_view import ServingState
from gpufence.control.observe.series_ring import (
    GpuPoint,
    LinkPoint,
    Point,
    QueuePoint,
    SeriesRing,
    ServingPoint,
    StoragePoint,
)
from gpufence.model.cluster import Cluster
from gpufence.model.job import WorkloadClass
from gpufence.telemetry import histograms as hist

log = logging.getLogger("gpufence.observe")
MAX_PUSH = 10_000  # latencies one push may carry


class Observatory:
    def __init__(
        self,
        cluster: Cluster,
        settings: TelemetrySettings,
        telemetry: Telemetry,
        board: GpuBoard,
        host: HostStats,
        clock: Callable[[], float],
    ) -> None:
        self.cluster = cluster
        self.settings = settings
        self.telemetry = telemetry
        self.board = board
        self.host = host
        self.clock = clock
        s = settings
        self.book = LatencyBook(s.series_step_s, s.latency_window_s, s.series_retention_s, clock)
        self.scraper = Scraper(self.book, s.scrape_timeout_s, s.scrape_hosts)
        self.ring = SeriesRing(s.points)
        self.state = ServingState()  # the last one read (the collectors' replicas)
        self.started_at = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the thread
    def start(self, read: Callable[[], ServingState]) -> None:
        if self._thread is not None:
            return

        def run() -> None:
            while not self._stop.wait(self.settings.series_step_s):
                try:
                    self.step(read())
                except Exception:  # an observation bug must not end the observing
                    log.exception("series step failed")

        self._thread = threading.Thread(target=run, name="gpufence-observe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)
            self._thread = None

    def step(self, state: ServingState) -> Point:
        """Scrape, then one point at the clock's now."""
        self.state = state
        self.scraper.scrape(state.sources)
        point = self.point(state, self.clock())
        self.ring.append(point)
        return point

    # ------------------------------------------------------------------ pushes
    def push(
        self,
        key: DeploymentKey,
        partition: str,
        slo_s: float | None,
        score_s: float | None,
        latencies_s: Sequence[float],
    ) -> None:
        self.book.add(key, partition, slo_s, hist.binned(latencies_s), score_s=score_s)

    # ------------------------------------------------------------------ one point
    def point(self, state: ServingState, now: float) -> Point:
        summaries = {s.key: s for s in self.book.summaries(now)}
        fresh = self.book.take_fresh()
        serving: dict[DeploymentKey, ServingPoint] = {}
        for key in sorted(set(state.deployments) | set(summaries)):
            dep = state.deployments.get(key)
            summ = summaries.get(key)
            slo_s = dep.slo_s if dep is not None else (summ.slo_s if summ else None)
            serving[key] = ServingPoint(
                partition=dep.partition if dep is not None else (summ.partition if summ else ""),
                requests=fresh.get(key, 0.0),
                replicas=dep.replicas if dep is not None else 0,
                wanted=dep.wanted if dep is not None else 0,
                p99_ms=None if summ is None or summ.p99_s is None else summ.p99_s * 1000.0,
                slo_ms=None if slo_s is None else slo_s * 1000.0,
            )
        waits = self.telemetry.drain_waits()
        queue = {
            cls: QueuePoint(
                len(waits.get(cls, [])),
                max(waits[cls]) if waits.get(cls) else None,
                state.oldest_wait_s.get(cls, 0.0),
            )
            for cls in (str(c) for c in WorkloadClass)
        }
        gpus, links = self._gpus_and_links()
        storage = self._host(links)
        return Point(now, serving, queue, links, gpus, storage)

    def _gpus_and_links(self) -> tuple[dict[str, GpuPoint], dict[str, LinkPoint]]:
        cluster = self.cluster
        board = self.board.gpus()
        gpus: dict[str, GpuPoint] = {}
        links: dict[str, LinkPoint] = {}
        for gid, notes in sorted(board.items()):
            g = cluster.gpus[gid]
            node = cluster.nodes[g.node].name
            if "utilization" in notes or "memory_used_bytes" in notes:
                gpus[f"{node}/{g.index}"] = GpuPoint(
                    node,
                    g.index,
                    str(notes.get("uuid", "")),
                    notes.get("utilization"),
                    notes.get("memory_used_bytes"),
                )
            tx, rx = notes.get("nvlink_tx_bytes_s"), notes.get("nvlink_rx_bytes_s")
            if tx is not None and rx is not None:
                cap = cluster.gpu_type_of(gid).nvlink_gbps * 1e9 / 8 or None
                links[f"{node}/gpu{g.index}/nvlink"] = LinkPoint(
                    node,
                    f"gpu{g.index}",
                    "nvlink",
                    g.index,
                    tx + rx,
                    notes.get("nvlink_utilization"),
                    cap,
                )
            tx, rx = notes.get("pcie_tx_bytes_s"), notes.get("pcie_rx_bytes_s")
            if tx is not None and rx is not None:
                links[f"{node}/gpu{g.index}/pcie"] = LinkPoint(
                    node,
                    f"gpu{g.index}",
                    "pcie",
                    g.index,
                    max(tx, rx),
                    notes.get("pcie_utilization"),
                    notes.get("pcie_capacity_bytes_s"),
                )
        return gpus, links

    def _host(self, links: dict[str, LinkPoint]) -> StoragePoint | None:
        node = self.cluster.nodes[0].name  # this machine (the local executor's node)
        h = self.host.latest()
        for n in h.nics:
            links[f"{node}/{n.device}/nic"] = LinkPoint(
                node,
                n.device,
                "nic",
                None,
                max(n.tx_bytes_s, n.rx_bytes_s),
                n.utilization,
                n.capacity_bytes_s,
            )
        if h.disk is None:
            return None
        return StoragePoint(node, h.disk.device, h.disk.await_s, h.disk.busy)
