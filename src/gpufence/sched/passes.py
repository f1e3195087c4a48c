"""The placement passes of a cycle: own partition (with reservation + backfill), then lending.

Jobs are walked as shape heads in scheduling order (``queues.Walk``): jobs of one queue,
priority, shape and estimate bucket fit in exactly the same places, so when a head fails its
whole shape waits with the same reason (``Context.set_shape_pending``) and a 10,000-job queue
costs O(shapes + binds) per cycle.
"""

from __future__ import annotations

from collections.abc import Callable

from gpufence.model.decisions import Bind, PendingReason, Reason
from gpufence.model.partition import SharingMode
from gpufence.sched.admission import quota_blocks
from gpufence.sched.backfill import INF, reservable, reserve
from gpufence.sched.context import Context, Reservation
from gpufence.sched.jobs import JobRecord, JobState
from gpufence.sched.migdyn import repartition_for
from gpufence.sched.placement.fit import NotPlaced, Placed
from gpufence.sched.queues import ShapeKey
from gpufence.sched.reclaim import track
from gpufence.state.ledger import Allocation, charge_milli

CAPACITY = (Reason.NO_FIT, Reason.FRAGMENTED, Reason.MIG_LAYOUT)


def bind(
    ctx: Context,
    rec: JobRecord,
    pool: str,
    placed: Placed,
    reason: Reason,
    message: str = "",
    lent_from: str | None = None,
    incident: bool = False,
) -> None:
    job = rec.job
    alloc = Allocation(
        job=job,
        home=rec.home,
        queue=rec.queue,
        pool=pool,
        assignments=placed.assignments,
        charge_milli=charge_milli(job, ctx.cluster, pool),
        lent_from=lent_from,
        incident=incident,
    )
    ctx.ledger.allocate(alloc)
    ctx.queues.remove(job.id)
    rec.state = JobState.RUNNING
    rec.started_at = ctx.now
    rec.last_active = ctx.now
    if job.checkpointable:
        ctx.note_start(pool, job.id)
    ctx.pending_reason.pop(job.id, None)
    ctx.nominations.pop(job.id, None)
    if ctx.cluster.partitions[rec.home].reclaim is not None:
        ctx.interactive[job.id] = None
        track(ctx, rec)
    ctx.counters.binds += 1
    ctx.decisions.append(Bind(job.id, pool, placed.assignments, reason, message, lent_from))


def _valid(ctx: Context, p: str) -> Reservation | None:
    res = ctx.reservations.get(p)
    if res is None:
        return None
    led = ctx.ledger
    if res.job_id not in ctx.queues:
        del ctx.reservations[p]
        return None
    stale = (
        any(not led.gpu_usable(g) for g in res.gpus)
        or ctx.now > res.start  # the estimates were wrong, or the start fell between steps
    )
    if stale:
        # recompute for the same gang before anything is placed: dropping it would let the
        # jobs queued ahead of the gang take the GPUs it was about to get, and push it back
        new = reserve(ctx, ctx.queues.records[res.job_id].job, p)
        if new is None:
            del ctx.reservations[p]
            return None
        ctx.reservations[p] = new
        return new
    return res


def _hold(ctx: Context, res: Reservation | None) -> list[int]:
    if res is None:
        return []
    held = [g for g in res.gpus if ctx.ledger.is_free(g)]
    for g in held:
        ctx.ledger.hold(g, res.job_id)
    return held


def _unhold(ctx: Context, held: list[int]) -> None:
    for g in held:
        ctx.ledger.unhold(g)


def place_nominated(ctx: Context, p: str) -> None:
    """Jobs that noticed victims run first once the victims have stopped: at home, or (for an
    incident) on the donor pool whose GPUs the preemption freed.

    Quota is checked again before a home bind: it was checked when the job was nominated, but
    jobs of its queue may have bound since (after it in the same walk, or while it waited).
    Incident capacity in a donor pool is not charged to the queue, so it stays open to the job;
    a job its quota no longer admits at home and that has no donor pool loses its nomination
    and waits in its queue (where the walk reports the quota)."""
    led = ctx.ledger
    for jid, nom in list(ctx.nominations.items()):
        rec = ctx.records[jid]
        if rec.home != p or rec.state is not JobState.PENDING:
            continue
        if ctx.victims_pending(nom):
            ctx.set_pending(jid, Reason.WAITING_PREEMPTION, "waiting for noticed jobs to stop")
            continue
        charge = charge_milli(rec.job, ctx.cluster, p)
        admitted = quota_blocks(ctx.cluster, led, rec.queue, charge) is None
        r = ctx.engine.place(led, rec.job, p) if admitted else None
        if isinstance(r, Placed):
            bind(ctx, rec, p, r, Reason.FITS)
        elif not _try_nominated(ctx, rec, nom.pools, nom.incident):
            del ctx.nominations[jid]  # the capacity went elsewhere: protection looks again


def place_partition(ctx: Context, p: str) -> list[JobRecord]:
    """Place what fits of partition ``p``'s queue. Returns the jobs that failed for capacity."""
    led = ctx.ledger
    place_nominated(ctx, p)
    res = _valid(ctx, p)
    held = _hold(ctx, res)
    capacity_failed: list[JobRecord] = []

    def share(q: str) -> float:
        return ctx.fairshare.share(q, led)

    skips: dict[ShapeKey, int] = {}
    whole_only = ctx.cluster.partitions[p].sharing is SharingMode.EXCLUSIVE
    restricted = False
    walk = ctx.queues.walk(p, share)
    while (rec := walk.next()) is not None:
        if whole_only and res is not None and not held and led.pool_free[p] == 0:
            # no free GPU, the head-of-line gang already holds its reservation and nothing
            # reserved is free to backfill into: the rest of the queue waits
            msg = f"partition {p} has no free GPU"
            ctx.full_reason[p] = (ctx.cycle, PendingReason(Reason.NO_FIT, msg))
            walk.drop()
            break
        if (
            whole_only
            and not restricted
            and res is not None
            and led.pool_free[p] == 0
            and rec.job.priority <= res.priority
            and len(held) < len(res.gpus)
        ):
            # the only free GPUs are reserved ones, too few for the gang: from here on only a
            # job that may take them (backfill) or needs no GPU can bind; every other shape
            # would just be told it waits for the gang, so the walk leaves them out
            restricted = True
            keep = _may_pass_holds(ctx, res)
            msg = f"GPUs reserved for gang {res.job_id} (starts {_starts(res)})"
            ctx.full_reason[p] = (ctx.cycle, PendingReason(Reason.RESERVED_FOR_GANG, msg))
            walk.restrict(keep)
            if not keep(ctx.queues.shape_of(rec.job.id)):
                walk.drop()
                continue
        job = rec.job
        if job.id in ctx.nominations:  # waits for its victims (place_nominated)
            walk.skip()
            continue
        sk = ctx.queues.shape_of(job.id)
        est_ok = (
            res is not None
            and res.start != INF  # start unknown: any backfill could delay the gang
            and job.est_runtime_s is not None
            and ctx.now + job.est_runtime_s <= res.start
        )
        blocked = quota_blocks(ctx.cluster, led, rec.queue, charge_milli(job, ctx.cluster, p))
        if blocked is not None:
            ctx.set_shape_pending(sk, Reason.QUOTA, blocked)
            walk.drop()
            continue
        is_gang = res is not None and job.id == res.job_id
        if is_gang:
            _unhold(ctx, held)
            held = []
        r = ctx.engine.place(led, job, p, request_id=ctx.queues.request_of(job.id))
        if isinstance(r, Placed):
            bind(ctx, rec, p, r, Reason.FITS)
            walk.placed()
            if is_gang:
                ctx.reservations.pop(p, None)
                res = None
            continue
        if is_gang and res is not None:
            held = _hold(ctx, res)
            if r.reason in CAPACITY:  # the gang keeps its reservation; it is not behind itself
                _holds_reservation(ctx, rec, sk, r, res)
                capacity_failed.append(rec)
                walk.drop()
                continue
        if held and res is not None and r.reason in CAPACITY:
            outcome = _past_holds(ctx, rec, p, res, held, est_ok)
            if outcome is not None:
                held = outcome
                res = ctx.reservations.get(p)  # a higher-priority job may have ended it
                walk.placed()
                continue
            msg = f"GPUs reserved for gang {res.job_id} (starts {_starts(res)})"
            ctx.set_shape_pending(sk, Reason.RESERVED_FOR_GANG, msg)
            if _may_backfill_later(ctx, sk, res, skips):
                walk.skip()  # a shorter estimate further down this shape may still backfill
            else:
                walk.drop()
            continue
        if (
            r.reason in CAPACITY
            and (res is None or job.priority > res.priority)
            and reservable(ctx, job, p)
        ):
            _unhold(ctx, held)
            ctx.reservations.pop(p, None)
            res = reserve(ctx, job, p)
            held = _hold(ctx, res)
            if res is not None:
                ctx.reservations[p] = res
                _holds_reservation(ctx, rec, sk, r, res)
                capacity_failed.append(rec)
                walk.drop()
                continue
        mig = ctx.cluster.partitions[p].sharing is SharingMode.MIG
        if mig and r.reason in CAPACITY and repartition_for(ctx, rec):
            ctx.set_shape_pending(sk, Reason.RECONFIGURING, "waiting for a MIG re-partition")
            walk.drop()
            continue
        ctx.set_shape_pending(sk, r.reason, r.message)
        ctx.pending_reason.pop(job.id, None)
        walk.drop()
        if r.reason in CAPACITY:
            capacity_failed.append(rec)
    _unhold(ctx, held)
    return capacity_failed


MAX_BACKFILL_SKIPS = 64  # jobs of one shape tried per cycle for backfill past the first


def _may_pass_holds(ctx: Context, res: Reservation) -> Callable[[ShapeKey], bool]:
    """Shapes that could still bind while the only free GPUs are ``res``'s holds: higher
    priority than the gang, the gang's own, CPU-only, or an estimate bucket whose jobs may end
    before the gang starts (bound: half the bucket's floor, so float rounding of the bucket
    can only keep a shape too many, never one too few)."""
    q = ctx.queues
    gang = q.shape_of(res.job_id) if res.job_id in q else None
    room = res.start - ctx.now  # inf when the start is unknown: then no backfill at all

    def keep(sid: ShapeKey) -> bool:
        if sid == gang or q.priority(sid) > res.priority or q.gpus(sid) == 0:
            return True
        b = q.bucket(sid)
        return b is not None and res.start != INF and (0.0 if b <= 1 else 2.0 ** (b - 2)) <= room

    return keep


def _may_backfill_later(
    ctx: Context, sk: ShapeKey, res: Reservation, skips: dict[ShapeKey, int]
) -> bool:
    """Jobs of a shape share an estimate bucket (est in (2^(b-1), 2^b]); if even the bucket's
    shortest estimate could end before the gang starts, later jobs of the shape may backfill."""
    bucket = ctx.queues.bucket(sk)
    if bucket is None or res.start == INF:
        return False
    if ctx.now + 2.0 ** (bucket - 1) > res.start or skips.get(sk, 0) >= MAX_BACKFILL_SKIPS:
        return False
    skips[sk] = skips.get(sk, 0) + 1
    return True


def _holds_reservation(
    ctx: Context, rec: JobRecord, shape: int, r: NotPlaced, res: Reservation
) -> None:
    """The gang waits with its reservation; jobs of its shape wait behind it."""
    ctx.set_pending(rec.job.id, r.reason, f"{r.message}; GPUs reserved from {_when(res)}")
    ctx.set_shape_pending(shape, r.reason, f"behind gang {rec.job.id}, which holds the reservation")


def _starts(res: Reservation) -> str:
    return _when(res) if res.start == INF else f"by {_when(res)}"


def _when(res: Reservation) -> str:
    return "when running jobs end" if res.start == INF else f"t={res.start:g}"


def _past_holds(
    ctx: Context, rec: JobRecord, p: str, res: Reservation, held: list[int], est_ok: bool
) -> list[int] | None:
    """Would ``rec`` fit without the reservation's holds, and may it take them? If so bind it
    (higher priority than the gang, or backfill that ends before the gang's start) and return
    the new holds; otherwise leave everything as it was and return None."""
    if not (rec.job.priority > res.priority or est_ok):
        return None  # it may not take reserved GPUs whatever they would do for it
    led = ctx.ledger
    m = led.mark()
    _unhold(ctx, held)
    r = ctx.engine.place(led, rec.job, p)
    if isinstance(r, Placed) and (rec.job.priority > res.priority or est_ok):
        higher = rec.job.priority > res.priority
        reason = Reason.FITS if higher else Reason.BACKFILL
        msg = "" if higher else f"ends before gang {res.job_id} starts at t={res.start:g}"
        bind(ctx, rec, p, r, reason, msg)
        led.commit(m)
        if higher:
            del ctx.reservations[p]
            return []
        return _hold(ctx, res)
    led.rollback(m)
    return None


def _try_nominated(ctx: Context, rec: JobRecord, pools: tuple[str, ...], incident: bool) -> bool:
    for pool in pools:
        if pool == rec.home:
            continue
        r = ctx.engine.place(ctx.ledger, rec.job, pool)
        if isinstance(r, Placed):
            msg = f"on GPUs of {pool} freed by incident preemption"
            bind(ctx, rec, pool, r, Reason.INCIDENT, msg, incident=incident)
            return True
    return False


def lend_pass(ctx: Context, failed: dict[str, list[JobRecord]]) -> None:
    """Jobs that did not fit at home try the idle capacity other partitions lend them."""
    led = ctx.ledger
    starved = {p for p, recs in failed.items() if recs}
    for p, recs in failed.items():
        if not recs:
            continue
        rules = [
            (lp, rule)
            for lp, part in ctx.cluster.partitions.items()
            for rule in part.lending
            if p in rule.to
            and lp not in starved
            and lp != p
            and rule.cap_gpus > led.lent[lp]  # cap not reached
            and part.sharing is not SharingMode.MIG  # borrowers bring whole-GPU work
            # no whole GPU free in an exclusive or fractional lender: nothing to borrow
            and (part.sharing is SharingMode.TIME_SLICE or led.pool_free[lp] > 0)
        ]
        if not rules:
            continue
        walk = ctx.queues.walk(p, lambda q: ctx.fairshare.share(q, led))
        while (rec := walk.next()) is not None:
            job = rec.job
            if job.id in ctx.nominations:
                walk.skip()
                continue
            for lp, rule in rules:
                if rule.checkpointable_only and not job.checkpointable:
                    continue
                left = rule.cap_gpus - led.lent[lp]
                r = ctx.engine.place(led, job, lp, max_gpus=left)
                if isinstance(r, Placed):
                    bind(ctx, rec, lp, r, Reason.LENT, f"borrowing idle GPUs of {lp}", lent_from=lp)
                    walk.placed()
                    break
            else:
                walk.drop()
