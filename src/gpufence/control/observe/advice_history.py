"""The control plane's history as ``gpufence.advice.history.History``: jobs, attempts and the
decision log from the store (read-only), over the advice window (``control.advice``: the last
``of_last`` x ``period_s`` seconds, or since the first job if the store is younger).
"""

from __future__ import annotations

import re
from typing import Any

from gpufence.advice.history import (
    ENDED_BY_CANCEL,
    ENDED_BY_ITSELF,
    ENDED_BY_SCHEDULER,
    AttemptSpan,
    History,
    JobSpan,
    Mark,
)
from gpufence.control.base.jobspec import SubmitRequest, from_stored
from gpufence.control.store import database as st
from gpufence.model.cluster import Cluster
from gpufence.model.job import MILLI_PER_GPU

MARK_KINDS = ("notice", "notice-withdrawn", "stop")
_MIG_SLICES = re.compile(r"^(\d+)g\.")


def _share(req: SubmitRequest) -> float:
    """GPUs one replica holds: whole GPUs, a fraction, or a MIG instance's compute slices / 7."""
    if req.mig is not None:
        m = _MIG_SLICES.match(req.mig)
        return int(m.group(1)) / 7 if m else 1.0
    if req.gpu_fraction is not None:
        return round(req.gpu_fraction * MILLI_PER_GPU) / MILLI_PER_GPU
    return float(req.gpus)


def _home(cluster: Cluster, row: st.JobRow) -> str:
    """Where the job lives: its bound partition, else its queue's, else the first admitting
    its class (the scheduler's own resolution order)."""
    if row.partition in cluster.partitions:
        return row.partition
    q = cluster.queues.get(row.queue)
    if q is not None:
        return q.partition
    for p, part in cluster.partitions.items():
        if row.workload_class in {str(c) for c in part.admits}:
            return p
    return ""


def _ended_by(row: st.JobRow, last: st.AttemptRow | None) -> str:
    if row.state == st.CANCELLED:
        return ENDED_BY_CANCEL
    if row.state in (st.RECLAIMED, st.REJECTED):
        return ENDED_BY_SCHEDULER
    if row.state in (st.DONE, st.FAILED):
        stopped = last is not None and last.stop_reason
        return ENDED_BY_SCHEDULER if stopped else ENDED_BY_ITSELF
    return ""


def _job(cluster: Cluster, row: st.JobRow, last: st.AttemptRow | None) -> JobSpan | None:
    try:
        req = from_stored(row.spec)
    except ValueError:
        return None  # a spec this version cannot read: leave it out rather than guess
    per = _share(req)
    return JobSpan(
        id=row.id,
        tenant=row.tenant,
        workload_class=row.workload_class,
        partition=_home(cluster, row),
        gpus=per * req.replicas,
        replicas=req.replicas,
        per_replica=req.gpus if req.mig is None and req.gpu_fraction is None else 1,
        submitted=row.submitted_at,
        ended=row.ended_at if row.state in st.TERMINAL else None,
        state=row.state,
        ended_by=_ended_by(row, last),
        checkpointable=req.checkpointable,
        est_runtime_s=req.est_runtime_s,
        slo_p99_ms=req.slo_p99_ms,
        queue=row.queue or req.queue,
    )


def _attempt(cluster: Cluster, a: st.AttemptRow, acked: set[tuple[str, int]]) -> AttemptSpan:
    ids: list[int] = []
    share = 0.0
    for asg in a.assignments:
        gids = [int(g) for g in asg.get("gpus", ())]
        whole = int(asg.get("milli", 1000)) == MILLI_PER_GPU and not asg.get("mig_profile")
        if whole and not asg.get("time_sliced"):
            ids += gids
        share += len(gids) * int(asg.get("milli", 1000)) / MILLI_PER_GPU
    return AttemptSpan(
        job_id=a.job_id,
        attempt=a.attempt,
        partition=a.pool,  # whose GPUs: the lender's when borrowed
        lent_from=a.lent_from,
        gpu_ids=tuple(g for g in ids if 0 <= g < len(cluster.gpus)),
        gpus=share,
        start=a.started_at,
        end=a.ended_at,
        stop_reason=a.stop_reason or "",
        acked=(a.job_id, a.attempt) in acked,
    )


def read_history(reader: st.Reader, cluster: Cluster, now: float, window_s: float) -> History:
    """The history of the last ``window_s`` seconds (or since the first job) up to ``now``."""
    since = now - window_s
    rows = reader.jobs_since(since)
    attempts = reader.attempts_since(since)
    events = reader.events_since(since, (*MARK_KINDS, "checkpoint-ack"))
    acked = {
        (e["job_id"], int(e["message"].split()[-1]))
        for e in events
        if e["kind"] == "checkpoint-ack" and e["job_id"] and e["message"].split()[-1].isdigit()
    }
    last: dict[str, st.AttemptRow] = {}
    for a in attempts:
        if a.job_id not in last or a.attempt > last[a.job_id].attempt:
            last[a.job_id] = a
    jobs = [j for r in rows if (j := _job(cluster, r, last.get(r.id))) is not None]
    known = {j.id for j in jobs}
    spans = [_attempt(cluster, a, acked) for a in attempts if a.job_id in known]
    marks = [_mark(e) for e in events if e["kind"] in MARK_KINDS and e["job_id"] in known]
    first = min((j.submitted for j in jobs), default=now)
    return History(
        start=max(since, first),
        now=now,
        jobs=tuple(jobs),
        attempts=tuple(spans),
        marks=tuple(marks),
        source="the control plane's store",
    )


def _mark(e: dict[str, Any]) -> Mark:
    return Mark(float(e["t"]), str(e["job_id"]), str(e["kind"]), str(e["reason"]))
