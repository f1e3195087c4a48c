"""Taking capacity back: reclaim what a fence lent out, then (serving only) incident preemption.

Both start a handshake: victims get a Notice with a deadline; a CheckpointAck or the deadline
turns it into a Stop; the GPUs come back when the front end reports JobStopped.

Demand is handled as a batch per partition: the waiting jobs are walked in scheduling order inside
one ledger fork; each job's victims are searched with the earlier jobs already (tentatively)
placed, so a surge of ten replicas takes exactly the capacity ten replicas need, and every job
of the batch waits for the victims it depends on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from gpufence.model.decisions import Notice, Reason
from gpufence.model.job import WorkloadClass
from gpufence.model.partition import PreemptionMode, PreemptionPolicy
from gpufence.sched.admission import quota_blocks
from gpufence.sched.context import Context, Nomination
from gpufence.sched.jobs import JobRecord, JobState
from gpufence.sched.jobs import Notice as NoticeState
from gpufence.sched.placement.fit import Placed
from gpufence.state.ledger import Allocation, Ledger, charge_milli

INF = float("inf")
MAX_BATCH = 256  # waiting jobs considered per partition per cycle


def _place_tentatively(ctx: Context, rec: JobRecord, pool: str) -> bool:
    # the interned request shape of a queued job: hashing the shape itself is dear
    rid = ctx.queues.request_of(rec.job.id) if rec.job.id in ctx.queues else None
    r = ctx.engine.place(ctx.ledger, rec.job, pool, request_id=rid)
    if not isinstance(r, Placed):
        return False
    charge = charge_milli(rec.job, ctx.cluster, pool)
    incident = pool != rec.home
    ctx.ledger.allocate(
        Allocation(rec.job, rec.home, rec.queue, pool, r.assignments, charge, None, incident)
    )
    return True


def _victims_for(
    ctx: Context, rec: JobRecord, pool: str, candidates: list[str]
) -> list[str] | None:
    """Fewest of ``candidates`` (in order, then pruned) whose release lets ``rec`` fit in
    ``pool``; they are released in the ledger (the caller's fork) and ``rec`` placed there."""
    led = ctx.ledger
    chosen: list[str] = []
    with led.fork():
        for v in candidates:
            led.release(v)
            chosen.append(v)
            if isinstance(ctx.engine.place(led, rec.job, pool), Placed):
                break
        else:
            return None
    for v in reversed(list(chosen)):
        rest = [x for x in chosen if x != v]
        with led.fork():
            for x in rest:
                led.release(x)
            ok = isinstance(ctx.engine.place(led, rec.job, pool), Placed)
        if ok:
            chosen = rest
    for v in chosen:
        led.release(v)
    placed = _place_tentatively(ctx, rec, pool)
    assert placed, "victim search said it fits"
    return chosen


def _running(ctx: Context, pred: Callable[[JobRecord], bool]) -> list[str]:
    recs = [
        r
        for jid in ctx.ledger.allocs
        if (r := ctx.records.get(jid)) is not None
        and r.state is JobState.RUNNING
        and r.notice is None
        and pred(r)
    ]
    # lowest priority, least work lost, youngest first
    recs.sort(
        key=lambda r: (r.job.priority, r.work_at_risk(ctx.now), -(r.started_at or 0.0), r.job.id)
    )
    return [r.job.id for r in recs]


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


def protect_partition(ctx: Context, p: str, waiting: list[JobRecord]) -> None:
    """Reclaim lent capacity, then (for serving) preempt in an incident, for ``waiting`` jobs."""
    led = ctx.ledger
    part = ctx.cluster.partitions[p]
    pol = part.preemption
    on_demand = pol.mode is PreemptionMode.ON_DEMAND
    times = ctx.preempt_times.setdefault(p, deque())
    while times and times[0] <= ctx.now - pol.window_s:
        times.popleft()
    taken: dict[str, None] = {}  # victims chosen in this batch, in order
    plan: list[tuple[JobRecord, tuple[str, ...], str, Reason]] = []
    counted = 0
    budget_hit: list[JobRecord] = []
    # victims already noticed or chosen in this batch -> the pool their GPUs come back to
    inflight = {v: led.allocs[v].pool for v in ctx.noticed if v in led.allocs}
    lent_out = led.lent[p] > 0
    budget_left = (pol.budget - len(times)) if not on_demand else 1 << 30
    # candidate victims, in preference order, computed once per batch (they only shrink)
    lent_cands: list[str] | None = None
    donor_cands: dict[str, list[str]] = {}
    hopeless: dict[int, None] = {}  # request shapes no victim set can help this cycle
    # request shape -> ``changes`` when a job of it ran out of budget: until the batch changes
    # the fork (a placement, a victim search that found victims), the next one does too
    spent: dict[int, int] = {}
    changes = 0
    pools = {p, *pol.from_partitions}  # where this batch places (and so what it can use)
    with led.fork():
        for v in inflight:  # capacity already on its way back counts as free
            if _touches(led, led.allocs[v], pools):  # (idle sessions elsewhere need no undo)
                led.release(v)
        for rec in waiting[:MAX_BATCH]:
            if rec.job.id in ctx.nominations or rec.state is not JobState.PENDING:
                continue
            shape = ctx.queues.request_of(rec.job.id)
            if shape in hopeless:
                continue
            if spent.get(shape) == changes:
                budget_hit.append(rec)
                continue
            # the walk admitted it, but jobs of its queue may have bound after it (and earlier
            # jobs of this batch are placed in the fork): what would be charged to the queue
            # (a home placement, lent GPUs reclaimed for it) needs the quota it has now.
            # Capacity freed by incident preemption in a donor pool is not charged.
            blocked = quota_blocks(
                ctx.cluster, led, rec.queue, charge_milli(rec.job, ctx.cluster, p)
            )
            if blocked is not None:
                ctx.set_pending(rec.job.id, Reason.QUOTA, blocked)
            elif _place_tentatively(ctx, rec, p):
                changes += 1
                continue  # in-flight notices already cover it
            covered = _covered_elsewhere(ctx, rec, pol, inflight)
            if covered is not None:
                changes += 1
                ctx.nominations[rec.job.id] = Nomination(covered[1], (covered[0],), True)
                continue
            if lent_out and blocked is None:
                if lent_cands is None:
                    lent_cands = _running(ctx, lambda r: led.allocs[r.job.id].lent_from == p)
                got = _victims_for(ctx, rec, p, [v for v in lent_cands if v not in taken])
                if got is not None:
                    changes += 1
                    taken.update(dict.fromkeys(got))
                    inflight.update(dict.fromkeys(got, p))
                    plan.append((rec, tuple(taken), p, Reason.LENT_RECLAIM))
                    continue
            serving = rec.job.workload_class is WorkloadClass.SERVING
            if not serving or pol.mode is PreemptionMode.OFF:
                hopeless[shape] = None
                continue
            if counted >= budget_left:
                budget_hit.append(rec)
                spent[shape] = changes
                continue
            for pool in pol.from_partitions:
                if pool not in donor_cands:
                    donor_cands[pool] = _running(ctx, _eligible(ctx, pol, pool))
                cands = [v for v in donor_cands[pool] if v not in taken]
                got = _victims_for(ctx, rec, pool, cands)
                if got is None:
                    continue
                changes += 1  # the victims are released and the job placed in the fork
                if counted + len(got) > budget_left:
                    budget_hit.append(rec)
                    break
                counted += len(got)
                taken.update(dict.fromkeys(got))
                inflight.update(dict.fromkeys(got, pool))
                reason = Reason.ON_DEMAND_PREEMPTION if on_demand else Reason.INCIDENT_PREEMPTION
                plan.append((rec, tuple(taken), pool, reason))
                break
            else:
                hopeless[shape] = None
    ctx.protect_after[p] = _next_chance(ctx, pol, times, bool(budget_hit or hopeless))
    for rec in budget_hit:
        ctx.set_pending(
            rec.job.id,
            Reason.PREEMPTION_BUDGET,
            f"fence {p} is full; incident preemption budget spent "
            f"({len(times) + counted} of {pol.budget} in {pol.window_s:g} s)",
        )
    noticed: dict[str, None] = {}
    for rec, victims, pool, reason in plan:
        for v in victims:
            if v in noticed or v in ctx.noticed:
                continue
            noticed[v] = None
            vrec = ctx.records[v]
            if reason is Reason.LENT_RECLAIM:
                rule = next(r for r in part.lending if vrec.home in r.to)
                why = f"partition {p} reclaims its lent GPUs for {rec.job.id}"
                _notice(ctx, v, reason, rule.reclaim_deadline_s, False, why)
            else:
                times.append(ctx.now)
                why = f"serving job {rec.job.id} needs GPUs its fence {p} cannot hold"
                _notice(ctx, v, reason, pol.grace_s, True, why)
        incident = reason is not Reason.LENT_RECLAIM
        ctx.nominations[rec.job.id] = Nomination(dict.fromkeys(victims), (pool,), incident)
        ctx.set_pending(rec.job.id, Reason.WAITING_PREEMPTION, f"waiting for {', '.join(victims)}")


def _touches(led: Ledger, alloc: Allocation, pools: set[str]) -> bool:
    """Does ``alloc`` hold anything (GPUs, or CPU and memory of a node) that a placement in
    ``pools`` could use?"""
    if alloc.pool in pools:
        return True
    return any(q in pools for a in alloc.assignments for q in led.node_pools(a.node))


def _covered_elsewhere(
    ctx: Context, rec: JobRecord, pol: PreemptionPolicy, inflight: dict[str, str]
) -> tuple[str, dict[str, None]] | None:
    """A serving job that fits in a donor pool once the victims already noticed there stop."""
    if rec.job.workload_class is not WorkloadClass.SERVING or pol.mode is PreemptionMode.OFF:
        return None
    for pool in pol.from_partitions:
        if _place_tentatively(ctx, rec, pool):
            return pool, {v: None for v, vp in inflight.items() if vp == pool}
    return None


def _next_chance(ctx: Context, pol: PreemptionPolicy, times: deque[float], waiting: bool) -> float:
    """When protection could find something it cannot find now: a budget slot frees up, or a
    running job in a donor pool ages past the minimum runtime. inf when nothing waits."""
    if not waiting or pol.mode is PreemptionMode.OFF:
        return INF
    best = INF
    if pol.mode is PreemptionMode.INCIDENT_ONLY:
        if times and len(times) >= pol.budget:
            best = times[0] + pol.window_s
        for pool in pol.from_partitions:
            aged = _first_to_age(ctx, pool, pol.min_runtime_s)
            if aged is not None:
                best = min(best, aged)
    return best


def _first_to_age(ctx: Context, pool: str, min_runtime_s: float) -> float | None:
    """Earliest start + ``min_runtime_s`` still in the future among the checkpointable jobs
    running in ``pool``. ``ctx.starts`` holds binds in start order; an entry at the front is
    dropped for good when its job no longer runs there from that start (a later bind is a new
    entry) or when it has aged past every policy's minimum runtime (time only moves on), and
    the first valid entry still younger than ``min_runtime_s`` is the answer."""
    starts = ctx.starts.get(pool)
    if not starts:
        return None
    allocs = ctx.ledger.allocs
    records = ctx.records
    now = ctx.now
    longest = ctx.donor_min_runtime[pool]

    def valid(start: float, jid: str) -> bool:
        a = allocs.get(jid)
        return a is not None and a.pool == pool and records[jid].started_at == start

    while starts and (starts[0][0] + longest <= now or not valid(*starts[0])):
        starts.popleft()
    for start, jid in starts:
        if start + min_runtime_s > now and valid(start, jid):
            return start + min_runtime_s
    return None


def _eligible(ctx: Context, pol: PreemptionPolicy, pool: str) -> Callable[[JobRecord], bool]:
    on_demand = pol.mode is PreemptionMode.ON_DEMAND

    def ok(r: JobRecord) -> bool:
        a = ctx.ledger.allocs[r.job.id]
        if a.pool != pool or r.job.workload_class is WorkloadClass.SERVING:
            return False
        if on_demand:
            return True
        started = r.started_at
        return (
            r.job.checkpointable and started is not None and ctx.now - started >= pol.min_runtime_s
        )

    return ok
