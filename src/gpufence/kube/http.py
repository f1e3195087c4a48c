"""``/healthz``, ``/readyz``, ``/metrics`` and ``/v1/fences`` of a scheduler replica.

Every replica serves them; only the leader is ready (a standby answers 503 and names the
leader, so a Service in front of the replicas reaches the one that schedules).
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufence.kube.leader import LeaderElector
from gpufence.kube.loop import KubeScheduler
from gpufence.telemetry.holdings import partition_figures, queue_figures

STALL_S = 60.0


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
            fence_rows = partition_figures(core) if core is not None else []
            queue_rows = queue_figures(core) if core is not None else []
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
        # a leader whose loop stopped cycling is not healthy: the kubelet restarts it and a
        # standby takes over (the loop cycles at least once a second when idle)
        stalled = loop.stats.synced and time.time() - loop.stats.last_cycle > STALL_S
        if stalled and (elector is None or elector.leading.is_set()):
            return PlainTextResponse(f"stalled: no cycle for over {STALL_S:g}s\n", status_code=503)
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

    @app.get("/", response_class=HTMLResponse)
    def dashboard() -> HTMLResponse:
        """Who holds what, as a page that refreshes itself (the figures of /v1/fences)."""
        with loop.lock:
            core = loop.core
            fence_rows = partition_figures(core) if core is not None else []
            queue_rows = queue_figures(core) if core is not None else []
        return HTMLResponse(_page(fence_rows, queue_rows, elector))

    @app.get("/v1/fences")
    def fences() -> JSONResponse:
        with loop.lock:
            core = loop.core
            body: dict[str, Any] = {
                "fences": partition_figures(core) if core is not None else [],
                "queues": queue_figures(core) if core is not None else [],
                "problems": list(loop.hardware.problems) if loop.hardware is not None else [],
            }
        return JSONResponse(body)

    return app


def _table(rows: list[dict[str, Any]], keys: list[str]) -> str:
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(r.get(k, '')))}</td>" for k in keys) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _page(fence_rows: list[dict[str, Any]], queue_rows: list[dict[str, Any]], elector: Any) -> str:
    who = "this replica leads" if elector is None or elector.leading.is_set() else "standby"
    fence_keys = ["name", "nodes", "capacity_gpus", "used_gpus", "lent_gpus", "borrowed_gpus"]
    fence_keys += ["running", "pending", "largest_gang"]
    queue_keys = ["name", "partition", "tenant", "nominal_gpus", "used_gpus", "borrowed_gpus"]
    queue_keys += ["running", "pending"]
    return (
        "<!doctype html><meta charset=utf-8><meta http-equiv=refresh content=5>"
        "<title>gpufence fences</title><style>body{font:14px sans-serif}"
        "td,th{padding:2px 8px;text-align:right}</style>"
        f"<h1>gpufence on Kubernetes</h1><p>{who}</p><h2>Fences</h2>"
        f"{_table(fence_rows, fence_keys)}<h2>Queues</h2>{_table(queue_rows, queue_keys)}"
    )


def serve(app: FastAPI, host: str, port: int) -> threading.Thread:
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="http", daemon=True)
    thread.start()
    return thread
