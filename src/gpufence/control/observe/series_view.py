"""``GET /v1/series``: the ring's points bucketed onto one time axis, with the decision log's
marks, as one viewer may see them.

Bucketing (``step_s`` >= the ring's step): request rates, link and GPU figures are the mean of
the bucket's points, p99 and waits their maximum, starts their sum, replicas the last point's.
A tenant sees its own serving deployments and the marks of its own jobs; other tenants' are
counted (``other_tenants``), as ``/v1/nodes`` does (``tenantview.py``). Links, GPUs, storage
and queue delay per class are cluster figures that name no job, shown to everyone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from gpufence.control.base.config import ADMIN
from gpufence.control.base.tenantview import Owner, redact
from gpufence.control.observe.latency_book import DeploymentKey
from gpufence.control.observe.observatory import Observatory
from gpufence.control.observe.series_model import (
    GpuSeries,
    LatencySourceStatus,
    LinkSeries,
    Mark,
    OtherTenants,
    QueueDelaySeries,
    SeriesResponse,
    ServingSeries,
    StorageSeries,
)
from gpufence.control.observe.series_ring import Point
from gpufence.telemetry.incidents import PREEMPTION_REASONS, RECLAIM_REASONS

MAX_BUCKETS = 5000
MAX_MARKS = 5000
MARK_EVENTS = ("notice", "notice-withdrawn", "stop", "requeue", "node-down", "node-up")
T = TypeVar("T")


class SeriesQueryError(ValueError):
    """A query the series cannot answer; ``field`` names the parameter to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _mean(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def _max(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return max(vals) if vals else None


def _last(xs: Sequence[T | None]) -> T | None:
    return next((x for x in reversed(xs) if x is not None), None)


def _column(
    buckets: list[list[Point]],
    get: Callable[[Point], float | None],
    agg: Callable[[list[float | None]], float | None],
) -> list[float | None]:
    return [agg([get(p) for p in b]) if b else None for b in buckets]


def mark_kind(event: str, reason: str) -> str:
    if event == "stop" and reason in PREEMPTION_REASONS:
        return "preemption"
    if event == "stop" and reason in RECLAIM_REASONS:
        return "reclaim"
    return event


def _marks(
    events: list[dict[str, Any]], until: float, viewer: str, owner: Owner
) -> tuple[list[Mark], int, bool]:
    shown: list[Mark] = []
    hidden = 0
    for e in events:
        if e["t"] > until or e["kind"] not in MARK_EVENTS:
            continue
        jid = e.get("job_id")
        if viewer != ADMIN and jid is not None and owner(jid) != viewer:
            hidden += 1
            continue
        msg = redact(e.get("message") or "", viewer, owner)
        kind = mark_kind(e["kind"], e.get("reason") or "")
        shown.append(
            Mark(t=e["t"], kind=kind, reason=e.get("reason") or "", job_id=jid, message=msg)
        )
    truncated = len(shown) > MAX_MARKS
    return shown[-MAX_MARKS:], hidden, truncated


def _serving(
    obs: Observatory, buckets: list[list[Point]], viewer: str, step_s: float
) -> tuple[list[ServingSeries], int]:
    keys: set[DeploymentKey] = {k for b in buckets for p in b for k in p.serving}
    summaries = {s.key: s for s in obs.book.summaries()}
    status = obs.scraper.status
    sources: dict[DeploymentKey, list[LatencySourceStatus]] = {}
    for src in obs.state.sources:
        up, err = status.get(src.job_id, (False, "not scraped yet"))
        sources.setdefault(src.key, []).append(
            LatencySourceStatus(job_id=src.job_id, up=up, error=err)
        )
    out: list[ServingSeries] = []
    hidden = 0
    for key in sorted(keys | set(obs.state.deployments)):
        if viewer != ADMIN and key.tenant != viewer:
            hidden += 1
            continue
        pts = [[p.serving[key] for p in b if key in p.serving] for b in buckets]
        latest = _last([s for b in pts for s in b])
        dep = obs.state.deployments.get(key)
        partition = latest.partition if latest else (dep.partition if dep else "")
        slo_ms = latest.slo_ms if latest else None
        summ = summaries.get(key)
        out.append(
            ServingSeries(
                deployment=key.name,
                tenant=key.tenant,
                partition=partition,
                slo_p99_ms=slo_ms,
                slo_attainment=summ.attainment if summ else None,
                request_rate=[
                    sum(s.requests for s in b) / (len(b) * step_s) if b else None for b in pts
                ],
                replicas=[b[-1].replicas if b else None for b in pts],
                replicas_wanted=[b[-1].wanted if b else None for b in pts],
                p99_ms=[_max(s.p99_ms for s in b) for b in pts],
                latency_sources=sources.get(key, []),
            )
        )
    return out, hidden


def _queue(buckets: list[list[Point]]) -> list[QueueDelaySeries]:
    classes = sorted({c for b in buckets for p in b for c in p.queue})
    out = []
    for c in classes:
        pts = [[p.queue[c] for p in b if c in p.queue] for b in buckets]
        out.append(
            QueueDelaySeries(
                workload_class=c,
                started=[sum(q.started for q in b) for b in pts],
                max_wait_s=[_max(q.max_wait_s for q in b) for b in pts],
                oldest_waiting_s=[_max(q.oldest_wait_s for q in b) for b in pts],
            )
        )
    return out


def _links(buckets: list[list[Point]]) -> list[LinkSeries]:
    out = []
    for key in sorted({k for b in buckets for p in b for k in p.links}):
        pts = [[p.links[key] for p in b if key in p.links] for b in buckets]
        first = next(x for b in pts for x in b)
        out.append(
            LinkSeries(
                link=first.link,
                node=first.node,
                link_class=first.link_class,
                gpu=first.gpu,
                capacity_bytes_per_s=first.capacity_bytes_s,
                bytes_per_s=[_mean(x.bytes_s for x in b) for b in pts],
                utilization=[_mean(x.utilization for x in b) for b in pts],
            )
        )
    return out


def _gpus(buckets: list[list[Point]]) -> list[GpuSeries]:
    out = []
    keys = sorted(
        {k for b in buckets for p in b for k in p.gpus},
        key=lambda k: (k.rsplit("/", 1)[0], int(k.rsplit("/", 1)[1])),
    )
    for key in keys:
        pts = [[p.gpus[key] for p in b if key in p.gpus] for b in buckets]
        first = next(x for b in pts for x in b)
        out.append(
            GpuSeries(
                node=first.node,
                gpu=first.gpu,
                uuid=first.uuid,
                utilization=[_mean(x.utilization for x in b) for b in pts],
                memory_used_bytes=[_mean(x.memory_used_bytes for x in b) for b in pts],
            )
        )
    return out


def _storage(buckets: list[list[Point]]) -> list[StorageSeries]:
    keys = sorted({(p.storage.node, p.storage.device) for b in buckets for p in b if p.storage})
    out = []
    for node, dev in keys:
        pts = [
            [
                p.storage
                for p in b
                if p.storage and (p.storage.node, p.storage.device) == (node, dev)
            ]
            for b in buckets
        ]
        out.append(
            StorageSeries(
                node=node,
                device=dev,
                await_s=[_mean(s.await_s for s in b if s) for b in pts],
                busy=[_mean(s.busy for s in b if s) for b in pts],
            )
        )
    return out


def axis(
    since: float, until: float, step_s: float, base_step_s: float
) -> tuple[float, list[float]]:
    """(the step used, the bucket starts) of a query; SeriesQueryError names what to change."""
    if not (math.isfinite(since) and math.isfinite(until)) or until <= since:
        raise SeriesQueryError("since", "since must be before until (unix seconds)")
    step = max(step_s, base_step_s)
    first = math.floor(since / step) * step
    n = math.ceil((until - first) / step)
    if n > MAX_BUCKETS:
        need = (until - first) / MAX_BUCKETS
        raise SeriesQueryError(
            "step",
            f"{n} buckets from since to until at step {step:g} s; at most {MAX_BUCKETS}: "
            f"raise step to {need:.3g} or more",
        )
    return step, [first + i * step for i in range(max(n, 1))]


def build(
    obs: Observatory,
    events: list[dict[str, Any]],
    viewer: str,
    owner: Owner,
    since: float,
    until: float,
    step_s: float,
    now: float,
) -> SeriesResponse:
    base = obs.settings.series_step_s
    step, starts = axis(since, until, step_s, base)
    buckets: list[list[Point]] = [[] for _ in starts]
    for p in obs.ring.between(starts[0], starts[-1] + step):
        i = int((p.t - starts[0]) // step)
        if 0 <= i < len(buckets):
            buckets[i].append(p)
    serving, hidden_deps = _serving(obs, buckets, viewer, base)
    marks, hidden_marks, truncated = _marks(events, until, viewer, owner)
    return SeriesResponse(
        now=now,
        since=since,
        until=until,
        step_s=step,
        base_step_s=base,
        retention_s=obs.settings.series_retention_s,
        oldest=obs.ring.oldest(),
        t=starts,
        serving=serving,
        queue_delay=_queue(buckets),
        links=_links(buckets),
        gpus=_gpus(buckets),
        storage=_storage(buckets),
        marks=marks,
        marks_truncated=truncated,
        other_tenants=None
        if viewer == ADMIN
        else OtherTenants(serving_deployments=hidden_deps, marks=hidden_marks),
    )
