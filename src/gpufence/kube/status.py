"""Who holds what, read off the core between cycles: per fence (partition) and per queue.

The same figures feed ``/metrics`` (the local plane's gauge names), ``/v1/fences`` (what
``gpufence k8s status`` prints) and the Fence / Queue custom resources' ``status``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpufence.model.lifecycle import JobState
from gpufence.sched.scheduler import Scheduler

_HOLDING = (JobState.RUNNING, JobState.STOPPING)


def fences(sched: Scheduler) -> list[dict[str, Any]]:
    cluster = sched.cluster
    pending: Counter[str] = Counter()
    running: Counter[str] = Counter()
    borrowed: Counter[str] = Counter()
    for rec in sched.jobs().values():
        if rec.state is JobState.PENDING:
            pending[rec.home] += 1
        elif rec.state in _HOLDING:
            running[rec.home] += 1
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
                "lent_gpus": use.lent_gpus,
                "borrowed_gpus": borrowed[name],
                "pending": pending[name],
                "running": running[name],
                "largest_gang": use.largest_gang,
            }
        )
    return out


def queues(sched: Scheduler) -> list[dict[str, Any]]:
    cluster = sched.cluster
    pending: Counter[str] = Counter()
    running: Counter[str] = Counter()
    used_milli: Counter[str] = Counter()
    for rec in sched.jobs().values():
        if rec.state is JobState.PENDING:
            pending[rec.queue] += 1
        elif rec.state in _HOLDING:
            running[rec.queue] += 1
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
