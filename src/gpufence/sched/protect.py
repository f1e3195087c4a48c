"""Taking capacity back: reclaim what a fence lent out, then (serving only) incident preemption.

Both start a handshake: victims get a Notice with a deadline; a CheckpointAck or the deadline
turns it into a Stop; the GPUs come back when the front end reports JobStopped. Victims are
searched in a ledger fork: release candidates in order until the waiting job fits, then drop the
ones it turned out not to need.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from gpufence.model.decisions import Notice, Reason
from gpufence.model.job import WorkloadClass
from gpufence.model.partition import PreemptionMode
from gpufence.sched.context import Context, Nomination
from gpufence.sched.jobs import JobRecord, JobState
from gpufence.sched.jobs import Notice as NoticeState
from gpufence.sched.placement.base import Placed


def _fits_after(ctx: Context, rec: JobRecord, pool: str, victims: list[str]) -> bool:
    with ctx.ledger.fork():
        for v in victims:
            ctx.ledger.release(v)
        return isinstance(ctx.engine.place(ctx.ledger, rec.job, pool), Placed)


def choose_victims(
    ctx: Context, rec: JobRecord, pool: str, candidates: list[str]
) -> list[str] | None:
    """Smallest prefix-then-pruned set of ``candidates`` whose release lets ``rec`` fit."""
    chosen: list[str] = []
    with ctx.ledger.fork():
        for v in candidates:
            ctx.ledger.release(v)
            chosen.append(v)
            if isinstance(ctx.engine.place(ctx.ledger, rec.job, pool), Placed):
                break
        else:
            return None
    for v in reversed(list(chosen)):
        rest = [x for x in chosen if x != v]
        if _fits_after(ctx, rec, pool, rest):
            chosen = rest
    return chosen


def _notice(
    ctx: Context, victim: str, reason: Reason, grace: float, counted: bool, why: str
) -> None:
    vrec = ctx.records[victim]
    deadline = ctx.now + grace
    vrec.notice = NoticeState(reason, deadline, counted)
    ctx.noticed[victim] = None
    ctx.decisions.append(Notice(victim, reason, deadline, why))
    if counted:
        ctx.counters.preemptions[reason] += 1
    else:
        ctx.counters.reclaims[reason] += 1


def _running(ctx: Context, pred: Callable[[JobRecord], bool]) -> list[JobRecord]:
    return [
        r
        for jid, _ in ctx.ledger.allocs.items()
        if (r := ctx.records[jid]).state is JobState.RUNNING and r.notice is None and pred(r)
    ]


def _victim_order(ctx: Context, recs: list[JobRecord]) -> list[str]:
    # lowest priority, least work lost, youngest first
    recs.sort(
        key=lambda r: (r.job.priority, r.work_at_risk(ctx.now), -(r.started_at or 0), r.job.id)
    )
    return [r.job.id for r in recs]


def reclaim_lent(ctx: Context, rec: JobRecord) -> bool:
    """Owner partition needs its lent GPUs back for ``rec``. True when notices went out."""
    pool = rec.home
    if ctx.ledger.lent[pool] == 0 or rec.job.id in ctx.nominations:
        return False
    borrowers = _running(ctx, lambda r: ctx.ledger.allocs[r.job.id].lent_from == pool)
    victims = choose_victims(ctx, rec, pool, _victim_order(ctx, borrowers))
    if not victims:
        return False
    for v in victims:
        rule = next(r for r in ctx.cluster.partitions[pool].lending if ctx.records[v].home in r.to)
        why = f"partition {pool} reclaims its lent GPUs for {rec.job.id}"
        _notice(ctx, v, Reason.LENT_RECLAIM, rule.reclaim_deadline_s, False, why)
    ctx.nominations[rec.job.id] = Nomination(dict.fromkeys(victims), (pool,), incident=False)
    ctx.set_pending(rec.job.id, Reason.WAITING_PREEMPTION, f"reclaiming lent GPUs: {victims}")
    return True


def protect_serving(ctx: Context, rec: JobRecord) -> bool:
    """Incident preemption for a serving job its fence cannot hold. True when notices went out."""
    if rec.job.workload_class is not WorkloadClass.SERVING or rec.job.id in ctx.nominations:
        return False
    pol = ctx.cluster.partitions[rec.home].preemption
    if pol.mode is PreemptionMode.OFF or not pol.from_partitions:
        return False
    on_demand = pol.mode is PreemptionMode.ON_DEMAND
    now = ctx.now
    times = ctx.preempt_times.setdefault(rec.home, deque())
    while times and times[0] <= now - pol.window_s:
        times.popleft()
    for pool in pol.from_partitions:

        def eligible(r: JobRecord, pool: str = pool) -> bool:
            a = ctx.ledger.allocs[r.job.id]
            if a.pool != pool or r.job.workload_class is WorkloadClass.SERVING:
                return False
            if on_demand:
                return True
            old_enough = r.started_at is not None and now - r.started_at >= pol.min_runtime_s
            return r.job.checkpointable and old_enough

        victims = choose_victims(ctx, rec, pool, _victim_order(ctx, _running(ctx, eligible)))
        if not victims:
            continue
        if not on_demand and len(times) + len(victims) > pol.budget:
            ctx.set_pending(
                rec.job.id,
                Reason.PREEMPTION_BUDGET,
                f"would preempt {len(victims)} jobs; {len(times)} of {pol.budget} preemptions "
                f"used in the last {pol.window_s:g} s",
            )
            return False
        reason = Reason.ON_DEMAND_PREEMPTION if on_demand else Reason.INCIDENT_PREEMPTION
        for v in victims:
            times.append(now)
            why = f"serving job {rec.job.id} needs GPUs its fence {rec.home} cannot hold"
            _notice(ctx, v, reason, pol.grace_s, True, why)
        ctx.nominations[rec.job.id] = Nomination(dict.fromkeys(victims), (pool,), incident=True)
        ctx.set_pending(rec.job.id, Reason.WAITING_PREEMPTION, f"waiting for {victims} to stop")
        return True
    return False
