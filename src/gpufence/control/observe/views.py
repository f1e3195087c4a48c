"""Read models of the live scheduler state for the API, the CLI and /metrics.

Each function takes the reconciler and runs on its thread (``Reconciler.call``), so it sees a
consistent ledger between two cycles and never races a placement. Those with a ``viewer`` show a
tenant only its own job ids (``tenantview.py``); the admin (the default) sees all.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from gpufence.control.base.config import ADMIN
from gpufence.control.base.tenantview import Owner, nodes_for, redact
from gpufence.sched.holdings import partition_figures
from gpufence.sched.jobs import JobState
from gpufence.state.closures import NodeClosures

if TYPE_CHECKING:
    from gpufence.control.reconciler import Reconciler


def _gpu(r: Reconciler, gid: int, reserved: dict[int, str]) -> dict[str, Any]:
    sched = r.scheduler
    gpu = sched.cluster.gpus[gid]
    use = sched.query.gpu(gid)
    out: dict[str, Any] = {
        "index": gpu.index,
        "id": gid,
        "type": gpu.gpu_type,
        "partition": gpu.partition,
        "nvlink_domain": gpu.nvlink_domain,
        "jobs": list(use.jobs),
        "milli_used": use.milli_used,
        "state": "down" if not use.usable else ("used" if use.jobs else "free"),
    }
    if out["state"] == "free" and gid in reserved:
        # idle, but kept for a waiting gang (backfill lets in only what ends before it
        # starts): shown as free, it looked like capacity nobody used (issue 32)
        out["state"], out["held_for"] = "held", reserved[gid]
    if use.mig is not None:
        if use.jobs:
            out["state"] = "used"  # (even on a node that is down: its instances are held)
        out["mig"] = [{"profile": m.profile, "start": m.start, "job": m.job} for m in use.mig]
    if r.gpu_board is not None:  # real GPUs: refused, MIG errors, MPS, foreign processes
        out.update(r.gpu_board.gpu(gid))
        if out.get("refused"):
            out["state"] = "refused"
    return out


def job_owner(r: Reconciler) -> Owner:
    """Job id -> its tenant: running jobs from memory, others from the store."""

    def owner(job_id: str) -> str | None:
        live = r.live.get(job_id)
        if live is not None:
            return live.tenant
        row = r.store.job(job_id)
        return row.tenant if row is not None else None

    return owner


def reserved_gpus(r: Reconciler) -> dict[int, str]:
    """GPU id -> the waiting gang each partition's reservation keeps it for."""
    out: dict[int, str] = {}
    for p in r.scheduler.cluster.partitions:
        res = r.scheduler.query.reservation(p)
        if res is not None:
            out.update(dict.fromkeys(res.gpus, res.job_id))
    return out


def nodes(r: Reconciler, viewer: str = ADMIN) -> list[dict[str, Any]]:
    sched = r.scheduler
    reserved = reserved_gpus(r)
    closures = sched.closures
    out = [
        {
            "name": n.name,
            "rack": n.rack,
            "up": n.idx not in closures.down,  # healthy (drained or not)
            "drain": _drain_of(closures, n.idx),
            "gpu_type": n.gpu_type,
            "fake": r.devices.discovery.fake,
            "gpus": [_gpu(r, g, reserved) for g in n.gpu_ids],
        }
        for n in sched.cluster.nodes
    ]
    if viewer != ADMIN:  # whose processes they are is for the admin to see
        for n in out:
            gpus: list[dict[str, Any]] = n["gpus"]  # type: ignore[assignment]
            for g in gpus:
                if "foreign" in g:
                    g["foreign"] = [
                        {"action": i["action"], "since": i["since"]} for i in g["foreign"]
                    ]
    return nodes_for(out, viewer, job_owner(r))


def _drain_of(closures: NodeClosures, node: int) -> dict[str, Any] | None:
    """The node's drain (reason, deadline), or the maintenance window it is in now."""
    d = closures.drained.get(node)
    if d is not None:
        return {"reason": d.reason, "deadline": d.deadline}
    for w in closures.windows.values():
        if node in w.nodes and w.active(closures.now):
            return {"reason": f"maintenance {w.window_id}: {w.reason}", "deadline": None}
    return None


def largest_gang(r: Reconciler, partition: str) -> int:
    """Whole GPUs the largest single-node gang could get now (the fragmentation gauge)."""
    return r.scheduler.query.pool(partition).largest_gang


def partitions(r: Reconciler) -> list[dict[str, Any]]:
    out = partition_figures(r.scheduler)
    for p in out:
        del p["nodes"]  # (the local plane's API shape; its nodes are listed by /v1/nodes)
        if r.gpu_board is not None:  # whether its sharing is enforced on the device, and how
            p.update(r.gpu_board.partition(p["name"]))
    return out


def explain(r: Reconciler, job_id: str, viewer: str = ADMIN) -> dict[str, Any] | None:
    sched = r.scheduler
    rec = sched.jobs().get(job_id)
    if rec is None:
        return None
    out: dict[str, Any] = {
        "id": job_id,
        "state": str(rec.state),
        "partition": rec.home,
        "queue": rec.queue,
        "attempt": rec.attempt,
    }
    why = sched.why_pending(job_id)
    if why is not None:
        out["pending"] = {
            "reason": str(why.reason),
            "message": redact(why.message, viewer, job_owner(r)),
        }
    if rec.notice is not None:
        out["notice"] = {"reason": str(rec.notice.reason), "deadline": rec.notice.deadline}
    if rec.home:
        out["fair_share"] = [
            {
                "queue": t.queue,
                "tenant": t.tenant,
                "weight": t.weight,
                "holding_gpus": t.holding_gpus,
                "decayed_usage_gpu_h": t.decayed_usage_gpu_h,
                "share": t.share,
                "rank": t.rank,
                "explanation": t.explanation,
            }
            for t in sched.fair_share(rec.home)
        ]
    return out


def pending_reasons(
    r: Reconciler, job_ids: list[str], viewer: str = ADMIN
) -> dict[str, dict[str, str]]:
    out = {}
    owner = job_owner(r)
    for jid in job_ids:
        why = r.scheduler.why_pending(jid)
        if why is not None:
            out[jid] = {"reason": str(why.reason), "message": redact(why.message, viewer, owner)}
    return out


def gauges(r: Reconciler) -> dict[str, Any]:
    """Everything /metrics reads from live state, in one pass."""
    sched = r.scheduler
    jobs: Counter[tuple[str, str, str]] = Counter()
    for rec in sched.jobs().values():
        if rec.state in (JobState.PENDING, JobState.RUNNING, JobState.STOPPING):
            state = "pending" if rec.state is JobState.PENDING else "running"
            jobs[(state, rec.home, str(rec.job.workload_class))] += 1
    notes = []
    if r.gpu_board is not None:
        gpus = sched.cluster.gpus
        for gid, n in sorted(r.gpu_board.gpus().items()):
            notes.append({**n, "index": gpus[gid].index})
    return {"jobs": dict(jobs), "partitions": partitions(r), "gpu_notes": notes}
