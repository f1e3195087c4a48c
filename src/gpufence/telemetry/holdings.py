"""Who holds what, per partition (fence) and per queue, read off a Scheduler between cycles:
one definition for every front end that shows it (the local plane's /v1/partitions and
/metrics, the Kubernetes front end's /v1/fences, /metrics and Fence/Queue objects)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpufence.model.lifecycle import JobState
from gpufence.sched.scheduler import Scheduler

_HOLDING = (JobState.RUNNING, JobState.STOPPING)


def _counts(sched: Scheduler, key: str) -> tuple[Counter[str], Counter[str]]:
    """Pending and holding jobs per home partition (key "home") or per queue ("queue")."""
    pending: Counter[str] = Counter()
    running: Counter[str] = Counter()
    for rec in sched.jobs().values():
        where = rec.home if key == "home" else rec.queue
        if rec.state is JobState.PENDING:
            pending[where] += 1
        elif rec.state in _HOLDING:
            running[where] += 1
    return pending, running


def partition_figures(sched: Scheduler) -> list[dict[str, Any]]:
    cluster = sched.cluster
    pending, running = _counts(sched, "home")
    borrowed: Counter[str] = Counter()
    for h in sched.query.holdings():
        if h.lent_from is not None:
            borrowed[h.home] += h.gpus
    out = []
    for name, part in cluster.partitions.items():
        use = sched.query.pool(name)
        out.append(
            {
                "name": name,
                "admits": sorted(str(c) for c in part.admits),
                "sharing": str(part.sharing),
                "nodes": len(cluster.partition_nodes[name]),
                "capacity_gpus": len(cluster.partition_gpus[name]),
                "used_gpus": round(use.used_milli / 1000, 3),
                "free_whole_gpus": use.free_whole_gpus,
                "lent_gpus": use.lent_gpus,
                "borrowed_gpus": borrowed[name],
                "pending": pending[name],
                "running": running[name],
                "largest_gang": use.largest_gang,
                "queues": list(cluster.partition_queues[name]),
            }
        )
    return out


def queue_figures(sched: Scheduler) -> list[dict[str, Any]]:
    cluster = sched.cluster
    pending, running = _counts(sched, "queue")
    used_milli: Counter[str] = Counter()
    records = sched.jobs()
    for h in sched.query.holdings():
        used_milli[records[h.job_id].queue] += h.charge_milli
    out = []
    for name, q in cluster.queues.items():
        nominal = None if q.nominal_milli is None else q.nominal_milli / 1000
        used = used_milli[name] / 1000
        out.append(
            {
                "name": name,
                "partition": q.partition,
                "tenant": q.tenant,
                "nominal_gpus": nominal,
                "used_gpus": used,
                "borrowed_gpus": max(0.0, used - nominal) if nominal is not None else 0.0,
                "pending": pending[name],
                "running": running[name],
            }
        )
    return out
