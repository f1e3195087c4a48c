"""Victim search for protection (sched/protect.py): which running jobs to notice so that a
waiting job fits, tried in a ledger fork, fewest victims first.

Candidates are ordered lowest priority, least work lost (GPU-seconds since their last
checkpoint), youngest first; the search releases
them in that order until the job fits, then prunes every victim the job turns out not to need.
"""

from __future__ import annotations

from collections.abc import Callable

from gpufence.model.job import WorkloadClass
from gpufence.model.partition import PreemptionMode, PreemptionPolicy
from gpufence.sched.book import JobBook
from gpufence.sched.context import Core
from gpufence.sched.jobs import JobRecord, JobState
from gpufence.sched.placement.fit import Placed
from gpufence.state.ledger import Allocation, Ledger, charge_milli


def place_tentatively(core: Core, rec: JobRecord, pool: str) -> bool:
    """Place ``rec`` in ``pool`` in the caller's fork, if it fits."""
    # the interned request shape of a queued job: hashing the shape itself is dear
    rid = core.queues.request_of(rec.job.id) if rec.job.id in core.queues else None
    r = core.engine.place(core.ledger, rec.job, pool, request_id=rid)
    if not isinstance(r, Placed):
        return False
    charge = charge_milli(rec.job, core.cluster, pool)
    incident = pool != rec.home
    core.ledger.allocate(
        Allocation(rec.job, rec.home, rec.queue, pool, r.assignments, charge, None, incident)
    )
    return True


def victims_for(core: Core, rec: JobRecord, pool: str, candidates: list[str]) -> list[str] | None:
    """Fewest of ``candidates`` (in order, then pruned) whose release lets ``rec`` fit in
    ``pool``; they are released in the ledger (the caller's fork) and ``rec`` placed there."""
    led = core.ledger
    chosen: list[str] = []
    with led.fork():
        for v in candidates:
            led.release(v)
            chosen.append(v)
            if isinstance(core.engine.place(led, rec.job, pool), Placed):
                break
        else:
            return None
    for v in reversed(list(chosen)):
        rest = [x for x in chosen if x != v]
        with led.fork():
            for x in rest:
                led.release(x)
            ok = isinstance(core.engine.place(led, rec.job, pool), Placed)
        if ok:
            chosen = rest
    for v in chosen:
        led.release(v)
    placed = place_tentatively(core, rec, pool)
    assert placed, "victim search said it fits"
    return chosen


def running(
    core: Core, book: JobBook, pred: Callable[[JobRecord], bool], pool: str | None = None
) -> list[str]:
    """Running, un-noticed jobs ``pred`` accepts (only those occupying ``pool`` if given), in
    victim preference order."""
    led = core.ledger
    recs = [
        r
        for jid in (led.allocs if pool is None else led.pool_allocs[pool])
        if (r := book.records.get(jid)) is not None
        and r.state is JobState.RUNNING
        and r.notice is None
        and pred(r)
    ]
    # lowest priority, least work lost, youngest first
    now = core.now
    # (work lost in GPU-seconds: a 1-GPU job of an hour before an 8-GPU gang of 20 minutes)
    recs.sort(key=lambda r: (r.job.priority, _lost(r, now), -(r.started_at or 0.0), r.job.id))
    return [r.job.id for r in recs]


def _lost(rec: JobRecord, now: float) -> float:
    return rec.work_at_risk(now) * rec.job.total_gpus


def eligible(core: Core, pol: PreemptionPolicy, pool: str) -> Callable[[JobRecord], bool]:
    """Who a serving job may preempt in donor ``pool`` under ``pol``: never serving, and never
    a job younger than the minimum runtime (on demand too: the policy's ``min_runtime_s`` was
    ignored there); on demand anyone else, in an incident only checkpointable jobs."""
    on_demand = pol.mode is PreemptionMode.ON_DEMAND

    def ok(r: JobRecord) -> bool:
        a = core.ledger.allocs[r.job.id]
        if a.pool != pool or r.job.workload_class is WorkloadClass.SERVING:
            return False
        started = r.started_at
        return (
            (on_demand or r.job.checkpointable)
            and started is not None
            and core.now - started >= pol.min_runtime_s
        )

    return ok


def first_to_age(
    core: Core, book: JobBook, pool: str, min_runtime_s: float, checkpointable_only: bool = True
) -> float | None:
    """Earliest start + ``min_runtime_s`` still in the future among the jobs running in
    ``pool`` that may be victims (checkpointable ones only, unless ``checkpointable_only`` is
    off: on-demand preemption). ``book.starts`` holds binds in start order; an entry at the front is
    dropped for good when its job no longer runs there from that start (a later bind is a new
    entry) or when it has aged past every policy's minimum runtime (time only moves on), and
    the first valid entry still younger than ``min_runtime_s`` is the answer."""
    starts = book.starts.get(pool)
    if not starts:
        return None
    allocs = core.ledger.allocs
    records = book.records
    now = core.now
    longest = book.donor_min_runtime[pool]

    def valid(start: float, jid: str) -> bool:
        a = allocs.get(jid)
        return a is not None and a.pool == pool and records[jid].started_at == start

    while starts and (starts[0][0] + longest <= now or not valid(*starts[0])):
        starts.popleft()
    for start, jid in starts:
        if start + min_runtime_s > now and valid(start, jid):
            if checkpointable_only and not records[jid].job.checkpointable:
                continue
            return start + min_runtime_s
    return None


def touches(led: Ledger, alloc: Allocation, pools: set[str]) -> bool:
    """Does ``alloc`` hold anything (GPUs, or CPU and memory of a node) that a placement in
    ``pools`` could use?"""
    if alloc.pool in pools:
        return True
    return any(q in pools for a in alloc.assignments for q in led.node_pools(a.node))
