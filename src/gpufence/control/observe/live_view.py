"""What ``/metrics`` and the series read from the live scheduler state, in one pass each.

Like ``observe/views.py``, every function takes the reconciler and runs on its thread
(``Reconciler.call``): a consistent ledger between two cycles. ``gauges`` feeds the Prometheus
collectors; ``serving_state`` tells the observatory which serving replicas run (and where to
scrape them), how many each deployment has and wants, and how long each class's oldest job has
waited.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufence.control.gpus.devices import DeviceError
from gpufence.control.observe import views
from gpufence.control.observe.latency_book import DeploymentKey
from gpufence.control.observe.latency_scrape import LatencySource
from gpufence.model.job import WorkloadClass
from gpufence.model.partition import PreemptionMode
from gpufence.sched.jobs import JobState
from gpufence.state.freecap import pool_free_milli
from gpufence.state.ledger import HOLD_PREFIX
from gpufence.telemetry.capacity import pool_fragmentation

if TYPE_CHECKING:
    from gpufence.control.reconciler import Reconciler

HELD = (JobState.RUNNING, JobState.STOPPING)


def _uuid(r: Reconciler, gid: int) -> str:
    gpu = r.scheduler.cluster.gpus[gid]
    if gpu.node != 0:  # only this machine's GPUs were discovered
        return ""
    return next((g.uuid for g in r.devices.discovery.gpus if g.index == gpu.index), "")


def _partitions(r: Reconciler) -> list[dict[str, Any]]:
    sched = r.scheduler
    cluster = sched.cluster
    out = views.partitions(r)
    windows = sched.query.preemption_windows()
    for p in out:
        part = cluster.partitions[p["name"]]
        free = pool_free_milli(sched.ledger, cluster, p["name"])
        p["fragmentation"] = pool_fragmentation(free, str(part.sharing))
        pol = part.preemption
        if pol.mode is PreemptionMode.INCIDENT_ONLY:
            p["preemption_budget"] = pol.budget
            p["preemption_window_s"] = pol.window_s
            p["preemptions_in_window"] = len(windows.get(p["name"], ()))
    return out


def _queues(r: Reconciler) -> list[dict[str, Any]]:
    """Every (partition, queue, admitted class) with its pending and running jobs, 0s too."""
    sched = r.scheduler
    cluster = sched.cluster
    pending: Counter[tuple[str, str, str]] = Counter()
    running: Counter[tuple[str, str, str]] = Counter()
    for rec in sched.jobs().values():
        key = (rec.home, rec.queue, str(rec.job.workload_class))
        if rec.state is JobState.PENDING:
            pending[key] += 1
        elif rec.state in HELD:
            running[key] += 1
    keys = {
        (name, q, str(c))
        for name, part in cluster.partitions.items()
        for q in cluster.partition_queues[name]
        for c in part.admits
    }
    keys |= set(pending) | set(running)
    return [
        {
            "partition": p,
            "queue": q,
            "class": c,
            "pending": pending[(p, q, c)],
            "running": running[(p, q, c)],
        }
        for p, q, c in sorted(keys)
    ]


def _fair_share(r: Reconciler) -> list[dict[str, Any]]:
    out = []
    for name in r.scheduler.cluster.partitions:
        for t in r.scheduler.fair_share(name):
            out.append(
                {
                    "partition": name,
                    "queue": t.queue,
                    "share": t.share,  # GPUs per unit of weight
                    "rank": t.rank,
                    "usage_gpu_s": t.decayed_usage_gpu_h * 3600.0,
                    "holding_gpus": t.holding_gpus,
                }
            )
    return out


def _mig_label(r: Reconciler, a: Any) -> str:
    if a.mig_profile is None:
        return ""
    try:
        return r.devices.devices(a)[0]  # the MIG device UUID the job was given
    except DeviceError:
        return f"{a.mig_profile}@{a.mig_start or 0}"


def allocations(r: Reconciler) -> list[dict[str, str]]:
    """One row per (job, GPU) held: the gpufence_gpu_allocated series."""
    cluster = r.scheduler.cluster
    owner = views.job_owner(r)
    out = []
    for jid, alloc in sorted(r.scheduler.ledger.allocs.items()):
        if jid.startswith(HOLD_PREFIX):
            continue
        tenant = owner(jid) or ""
        for a in alloc.assignments:
            mig = _mig_label(r, a)
            for gid in a.gpus:
                gpu = cluster.gpus[gid]
                out.append(
                    {
                        "node": cluster.nodes[gpu.node].name,
                        "gpu": str(gpu.index),
                        "uuid": _uuid(r, gid),
                        "mig": mig,
                        "job_id": jid,
                        "tenant": tenant,
                        "partition": alloc.home,
                        "class": str(alloc.job.workload_class),
                    }
                )
    return out


def gauges(r: Reconciler) -> dict[str, Any]:
    """Everything the Prometheus collectors read from live state."""
    cluster = r.scheduler.cluster
    down = r.scheduler.closures.down
    board = r.gpu_board.gpus() if r.gpu_board is not None else {}
    gpus = [
        {
            "node": cluster.nodes[g.node].name,
            "index": g.index,
            "uuid": _uuid(r, g.gid),
            **board.get(g.gid, {}),
        }
        for g in cluster.gpus
    ]
    return {
        "partitions": _partitions(r),
        "queues": _queues(r),
        "fair_share": _fair_share(r),
        "allocations": allocations(r),
        # up: healthy, drained or not (a drain closes a node to work, it does not take it down)
        "nodes": [(n.name, n.idx not in down) for n in cluster.nodes],
        "gpus": gpus,
    }


# ---------------------------------------------------------------------- serving
@dataclass
class DeploymentState:
    partition: str
    slo_s: float | None
    replicas: int = 0  # holding GPUs
    wanted: int = 0  # holding GPUs or waiting for them


@dataclass
class ServingState:
    sources: list[LatencySource] = field(default_factory=list)
    deployments: dict[DeploymentKey, DeploymentState] = field(default_factory=dict)
    oldest_wait_s: dict[str, float] = field(default_factory=dict)  # per class, pending jobs
    now: float = 0.0


def _slo_s(
    r: Reconciler, partition: str, slo_ms: float | None
) -> tuple[float | None, float | None]:
    """(the SLO in seconds: the job's, else its partition's; the partition's scoring window)."""
    part = r.scheduler.cluster.partitions.get(partition)
    pslo = part.slo if part is not None else None
    if slo_ms is None and pslo is not None:
        slo_ms = pslo.p99_ms
    return (None if slo_ms is None else slo_ms / 1000.0), (pslo.window_s if pslo else None)


def _url(spec: Any) -> str | None:
    if spec.metrics_url:
        return str(spec.metrics_url)
    if spec.metrics_port:  # the replica's node: this machine, where the local executor runs
        return f"http://127.0.0.1:{spec.metrics_port}/metrics"
    return None


def serving_state(
    r: Reconciler, names: MutableMapping[str, tuple[str, str, float | None]]
) -> ServingState:
    """``names`` caches job id -> (tenant, deployment name, SLO ms) across calls (pending jobs
    are read from the store once)."""
    sched = r.scheduler
    out = ServingState(now=sched.now)
    for jid, live in r.live.items():
        if live.orphan or live.workload_class != str(WorkloadClass.SERVING):
            continue
        spec = live.spec
        key = DeploymentKey(live.tenant, spec.name or jid)
        slo_s, score_s = _slo_s(r, live.partition, spec.slo_p99_ms)
        dep = out.deployments.setdefault(key, DeploymentState(live.partition, slo_s))
        if not live.stopping:
            dep.replicas += 1
            dep.wanted += 1
        url = _url(spec)
        if url is not None and not live.stopping:
            out.sources.append(
                LatencySource(
                    jid, live.attempt, key, live.partition, slo_s, score_s, url, spec.latency_metric
                )
            )
    waiting: set[str] = set()
    for jid, rec in sched.jobs().items():
        if rec.state is not JobState.PENDING:
            continue
        cls = str(rec.job.workload_class)
        out.oldest_wait_s[cls] = max(
            out.oldest_wait_s.get(cls, 0.0), sched.now - rec.job.submit_time
        )
        if rec.job.workload_class is not WorkloadClass.SERVING:
            continue
        waiting.add(jid)
        if jid not in names:
            row = r.store.job(jid)
            if row is None:
                continue
            names[jid] = (row.tenant, str(row.spec.get("name") or jid), row.spec.get("slo_p99_ms"))
        tenant, name, slo_ms = names[jid]
        slo_s, _ = _slo_s(r, rec.home, slo_ms)
        dep = out.deployments.setdefault(
            DeploymentKey(tenant, name), DeploymentState(rec.home, slo_s)
        )
        dep.wanted += 1
    for jid in [j for j in names if j not in waiting]:
        del names[jid]  # started or ended: no longer read from here
    return out
