"""``/healthz``, ``/readyz``, ``/metrics`` and ``/v1/fences`` of a scheduler replica.

Every replica serves them; only the leader is ready (a standby answers 503 and names the
leader, so a Service in front of the replicas reaches the one that schedules).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufence.kube import status
from gpufence.kube.leader import LeaderElector
from gpufence.kube.loop import KubeScheduler


class _Collector(Collector):
    def __init__(self, loop: KubeScheduler, elector: LeaderElector | None) -> None:
        self.loop, self.elector = loop, elector

    def collect(self) -> Iterator[Metric]:
        loop, st, counts = self.loop, self.loop.stats, self.loop.runner.counts
        leading = self.elector is None or self.elector.leading.is_set()
        yield _gauge("gpufence_k8s_leader", "1 on the replica that schedules", float(leading))
        for name, value, help_ in (
            ("gpufence_k8s_binds", counts.binds, "pods bound"),
            ("gpufence_k8s_bind_errors", counts.bind_errors, "binds the API server refused"),
            ("gpufence_k8s_pod_deletes", counts.deletes, "pods stopped (preemption, failures)"),
            ("gpufence_k8s_pending_reasons", counts.reasons, "PodScheduled=False written"),
            ("gpufence_k8s_cycles", st.cycles, "scheduling cycles"),
            ("gpufence_k8s_model_rebuilds", st.rebuilds, "cluster model rebuilt from the API"),
        ):
            counter = CounterMetricFamily(name, help_)
            counter.add_metric([], float(value))
            yield counter
        yield _gauge("gpufence_pending_jobs", "jobs waiting", float(st.pending))
        with loop.lock:
            core = loop.core
            fence_rows = status.fences(core) if core is not None else []
            queue_rows = status.queues(core) if core is not None else []
        for metric, key in (
            ("gpufence_partition_capacity_gpus", "capacity_gpus"),
            ("gpufence_partition_used_gpus", "used_gpus"),
            ("gpufence_partition_lent_gpus", "lent_gpus"),
            ("gpufence_partition_borrowed_gpus", "borrowed_gpus"),
            ("gpufence_largest_placeable_gang_gpus", "largest_gang"),
        ):
            fam = GaugeMetricFamily(metric, key.replace("_", " "), labels=["partition"])
            for row in fence_rows:
                fam.add_metric([row["name"]], float(row[key]))
            yield fam
        for metric, key in (
            ("gpufence_queue_pending_jobs", "pending"),
            ("gpufence_queue_used_gpus", "used_gpus"),
        ):
            fam = GaugeMetricFamily(metric, key.replace("_", " "), labels=["partition", "queue"])
            for row in queue_rows:
                fam.add_metric([row["partition"], row["name"]], float(row[key]))
            yield fam


def _gauge(name: str, help_: str, value: float) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name, help_)
    fam.add_metric([], value)
    return fam


def make_app(loop: KubeScheduler, elector: LeaderElector | None) -> FastAPI:
    app = FastAPI(title="gpufence on Kubernetes", docs_url=None, redoc_url=None)
    registry = CollectorRegistry()
    registry.register(_Collector(loop, elector))

    @app.get("/healthz")
    def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok\n")

    @app.get("/readyz")
    def readyz() -> PlainTextResponse:
        if elector is not None and not elector.leading.is_set():
            holder = elector.holder or "nobody yet"
            return PlainTextResponse(f"standby: the leader is {holder}\n", status_code=503)
        if not loop.stats.synced:
            return PlainTextResponse("leading, still reading nodes and pods\n", status_code=503)
        return PlainTextResponse("ok: leading\n")

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/fences")
    def fences() -> JSONResponse:
        with loop.lock:
            core = loop.core
            body: dict[str, Any] = {
                "fences": status.fences(core) if core is not None else [],
                "queues": status.queues(core) if core is not None else [],
                "problems": list(loop.hardware.problems) if loop.hardware is not None else [],
            }
        return JSONResponse(body)

    return app


def serve(app: FastAPI, host: str, port: int) -> threading.Thread:
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="http", daemon=True)
    thread.start()
    return thread
