"""Phase 4 of a cycle: place each partition's queue on its own capacity, with the head-of-line
gang's reservation and backfill. (Phase 5, lending, is ``sched/lend.py``.)

Jobs are walked as shape heads in scheduling order (``queues.Walk``): jobs of one queue,
priority, shape and estimate bucket fit in exactly the same places, so when a head fails its
whole shape waits with the same reason (``PendingReasons.set_shape``) and a 10,000-job queue
costs O(shapes + binds) per cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Bind, Decision, Reason
from gpufence.model.job import WorkloadClass
from gpufence.model.partition import SharingMode
from gpufence.sched.admission import Admission, quota_blocks
from gpufence.sched.backfill import INF, reservable, reserve
from gpufence.sched.book import JobBook
from gpufence.sched.context import Claims, Core, Nomination, Reservation
from gpufence.sched.drains import closed_note
from gpufence.sched.jobs import JobRecord, JobState
from gpufence.sched.migdyn import MigWork, repartition_for
from gpufence.sched.passing import ahead, ahead_by_share, may_pass_holds
from gpufence.sched.placement.fit import NotPlaced, Placed
from gpufence.sched.placement.whole import held_for
from gpufence.sched.queues import ShapeKey, Walk
from gpufence.sched.reasons import PendingReasons
from gpufence.sched.reclaim import track
from gpufence.state.ledger import Allocation, Ledger, charge_milli

CAPACITY = (Reason.NO_FIT, Reason.FRAGMENTED, Reason.MIG_LAYOUT)


@dataclass(slots=True)
class Placing:
    """What placing (phases 4 and 5) may touch: the core, the job book (binds), the claims
    (reservations, nominations), pending reasons and MIG re-partitions; ``out`` collects the
    phase's decisions."""

    core: Core
    book: JobBook
    claims: Claims
    reasons: PendingReasons
    mig: MigWork
    out: list[Decision] = field(default_factory=list)
    walk_again: set[str] = field(default_factory=set)  # walked even if nothing else changed
    reserved: set[str] = field(default_factory=set)  # a reservation was made in their walk


class PlaceMemo:
    """What placement remembers between cycles to skip partitions where nothing could fit."""

    def __init__(self, cluster: Cluster) -> None:
        # partition -> (freed, arrivals) versions, and the GPUs of its pools held for waiting
        # nominated jobs when it was last walked
        self.seen: dict[str, tuple[int, int, tuple[int, ...]]] = {}
        # partitions whose lent capacity a partition's jobs may borrow
        self.lenders: dict[str, list[str]] = {
            p: [lp for lp, part in cluster.partitions.items() for r in part.lending if p in r.to]
            for p in cluster.partitions
        }

    def dirty(self, st: Placing, p: str, held: list[int]) -> bool:
        """Could anything in partition ``p``'s queue fit now that did not last cycle? Only if
        capacity came back to a pool it may use, jobs arrived, its reservation fell due, a
        waiting job's victims stopped, or the GPUs held for waiting nominated jobs (``held``,
        this cycle's) changed in its pools -- a nomination that ended (its job cancelled, say)
        gives back GPUs that no release counts."""
        core = st.core
        led = core.ledger
        pools = [p, *self.lenders[p]]
        gpus = core.cluster.gpus
        on_hold = tuple(g for g in held if gpus[g].partition in pools)
        seen = (sum(led.freed[q] for q in pools), core.queues.added[p], on_hold)
        res = st.claims.reservations.get(p)
        due = res is not None and (
            core.now > res.start or res.overrun(core.now, led.allocs.__contains__)
        )
        nominated = any(st.book.records[j].home == p for j in st.claims.nominations)
        if seen == self.seen.get(p) and not due and not nominated:
            return False
        self.seen[p] = seen
        return True


def hold_for_nominations(st: Placing) -> list[int]:
    """While a job waits for its victims to stop, the free GPUs it will run on once they have
    stopped are held for it, so that nothing else (a requeued victim, a borrower, a job of
    the queue) takes what the preemption or reclaim is freeing. The holds last for this
    cycle's placement and lending only: the caller gives them back with ``release_holds``."""
    led = st.core.ledger
    held: list[int] = []
    plans = st.claims.plans
    for jid in [j for j in plans if j not in st.claims.nominations]:
        del plans[jid]
    taken: set[int] = set()  # planned for the jobs nominated before
    for jid, nom in list(st.claims.nominations.items()):
        if not st.book.waiting_on(nom):
            continue
        plan = plans.get(jid)
        # the plan made earlier stands while each of its GPUs is still free or its victims'
        # and none is planned for a job nominated before (re-planning every waiting job on
        # every cycle costs a placement each); an empty one (no room even once they have
        # stopped) is made again
        if (
            not plan
            or not all(led.is_free(g) or led.owner[g] in nom.victims for g in plan)
            or not taken.isdisjoint(plan)
        ):
            plan = plans[jid] = _planned(st, st.book.records[jid], nom, taken)
        if not plan and not _pool_node_down(st, nom):
            # its victims will not make room for it (what they free went elsewhere while a
            # node was down, say): waiting for them is in vain, so the job is walked again
            # this cycle and protection looks again (with a node of its pools down the plan
            # may count on it once it is back, and it waits)
            del st.claims.nominations[jid], plans[jid]
            st.reasons.forget(jid)
            st.walk_again.add(st.book.records[jid].home)
            continue
        taken.update(plan)
        for g in plan:
            if led.is_free(g):
                led.hold(g, jid)
                held.append(g)
    return held


def _pool_node_down(st: Placing, nom: Nomination) -> bool:
    c, led = st.core.cluster, st.core.ledger
    return any(not led.node_up[c.gpus[g].node] for q in nom.pools for g in c.partition_gpus[q])


def _hold_standing_plans(st: Placing) -> list[int]:
    """While the nominated jobs whose victims have stopped bind, the free GPUs of the plans
    still standing for the jobs that wait are held -- but not those planned for a ready job
    too (the jobs nominated in one batch wait for all its victims, so their plans may
    overlap, and the ready job goes first): a ready job (one nominated on capacity already
    free in a donor pool, say) binding at home must not take a GPU the walk held for a
    waiting job last cycle, leaving that job waiting for victims that no longer make room
    for it. The caller gives the holds back once the ready jobs are placed."""
    led = st.core.ledger
    noms, plans = st.claims.nominations, st.claims.plans
    waiting = {j: nom for j, nom in noms.items() if j in plans and st.book.waiting_on(nom)}
    ready = {g for j, plan in plans.items() if j in noms and j not in waiting for g in plan}
    held: list[int] = []
    for jid, nom in waiting.items():
        plan = plans[jid]
        if not all(led.is_free(g) or led.owner[g] in nom.victims for g in plan):
            continue  # no longer stands: planned again after the ready jobs are placed
        for g in plan:
            if g not in ready and led.is_free(g):
                led.hold(g, jid)
                held.append(g)
    return held


def _planned(st: Placing, rec: JobRecord, nom: Nomination, taken: set[int]) -> list[int]:
    """The GPUs ``rec`` would get once its victims have stopped (what-if, in a fork), but
    not those ``taken`` by the plans of the jobs nominated before it: the jobs nominated in
    one batch of protection wait for all of its victims, and the GPUs a later one planned
    on the earlier ones' share would be left free for anyone when those bind."""
    core = st.core
    led = core.ledger
    with led.fork():
        for v in nom.victims:
            if v in led.allocs:
                led.release(v)
        for g in taken:
            if led.is_free(g):
                led.hold(g, rec.job.id)
        for pool in nom.pools:
            r = core.engine.place(led, rec.job, pool)
            if isinstance(r, Placed):
                return [g for a in r.assignments for g in a.gpus]
    return []


def release_holds(led: Ledger, held: list[int]) -> None:
    for g in held:
        led.unhold(g)


def place_partitions(st: Placing, memo: PlaceMemo) -> tuple[dict[str, bool], list[int]]:
    """Every partition with pending work that could fit now, those with a job waiting for an
    incident preemption first: the nominated jobs whose victims have stopped bind first (on
    what the victims freed, not on what is held for the jobs still waiting), then the GPUs
    that waiting nominated jobs will run on are held for them, then each partition's queue is
    walked. Returns, per partition walked, whether a job failed for capacity (what lending
    and protection then look at), and the holds."""
    core = st.core
    first = [st.book.records[j].home for j, n in st.claims.nominations.items() if n.incident]
    order = list(dict.fromkeys([*first, *core.cluster.partitions]))
    held: list[int] = []
    if st.claims.nominations:
        standing = _hold_standing_plans(st)
        for p in order:
            place_nominated(st, p)
        release_holds(core.ledger, standing)
        held = hold_for_nominations(st)
    shapes = core.queues.shapes
    failed: dict[str, bool] = {}
    for p in order:
        if not (shapes[p] and (memo.dirty(st, p, held) or p in st.walk_again)):
            continue
        res = st.claims.reservations.get(p)
        failed[p] = place_partition(st, p)
        if (res is not None or p in st.reserved) and p not in st.claims.reservations:
            # the reservation ended during the walk (its gang bound, or a job ahead of it took
            # its GPUs), also one the walk itself made: the shapes told to wait for it earlier
            # in the walk may fit now (or wait for the gang's next reservation)
            failed[p] = place_partition(st, p) or failed[p]
    return failed, held


def first_refusal(core: Core, rec: JobRecord, charge: int) -> tuple[Admission, str] | None:
    """The first admission rule that refuses ``rec`` now, and why (None: admitted)."""
    for rule in core.admission:
        why = rule.refuses(core.cluster, core.ledger, rec, charge)
        if why is not None:
            return rule, why
    return None


def bind(
    st: Placing,
    rec: JobRecord,
    pool: str,
    placed: Placed,
    reason: Reason,
    message: str = "",
    lent_from: str | None = None,
    incident: bool = False,
) -> None:
    core, book = st.core, st.book
    job = rec.job
    now = core.now
    alloc = Allocation(
        job=job,
        home=rec.home,
        queue=rec.queue,
        pool=pool,
        assignments=placed.assignments,
        charge_milli=charge_milli(job, core.cluster, pool),
        lent_from=lent_from,
        incident=incident,
    )
    core.ledger.allocate(alloc)
    core.queues.remove(job.id)
    book.move(rec, JobState.RUNNING)
    rec.started_at = now
    rec.last_active = now
    if job.checkpointable or pool in book.on_demand_donors:
        book.note_start(pool, job.id, now)
    st.reasons.forget(job.id)
    st.claims.nominations.pop(job.id, None)
    home = core.cluster.partitions[rec.home]
    if job.time_limit_s is not None:
        book.arm_limit(rec, home.preemption.grace_s)
    if home.reclaim is not None:
        book.interactive[job.id] = None
        track(core.cluster, book, rec)
    book.counters.binds += 1
    st.out.append(Bind(job.id, pool, placed.assignments, reason, message, lent_from))


def _valid(st: Placing, p: str) -> Reservation | None:
    res = st.claims.reservations.get(p)
    if res is None:
        return None
    led = st.core.ledger
    if res.job_id not in st.core.queues:
        del st.claims.reservations[p]
        return None
    stale = (
        any(not led.gpu_usable(g) for g in res.gpus)
        or st.core.now > res.start  # the estimates were wrong, or the start fell between steps
        # a job the start counts on runs past its estimate (a backfilled one, say): the start
        # no longer holds, and the job is named
        or res.overrun(st.core.now, led.allocs.__contains__)
    )
    if stale:
        # recompute for the same gang before anything is placed: dropping it would let the
        # jobs queued ahead of the gang take the GPUs it was about to get, and push it back
        new = reserve(st.core, st.book, st.core.queues.records[res.job_id], p)
        if new is None:
            del st.claims.reservations[p]
            return None
        st.claims.reservations[p] = new
        return new
    return res


def _hold(st: Placing, res: Reservation | None) -> list[int]:
    if res is None:
        return []
    held = [g for g in res.gpus if st.core.ledger.is_free(g)]
    for g in held:
        st.core.ledger.hold(g, res.job_id)
    return held


def _unhold(st: Placing, held: list[int]) -> None:
    for g in held:
        st.core.ledger.unhold(g)


def place_nominated(st: Placing, p: str) -> None:
    """Jobs that noticed victims run first once the victims have stopped: at home, or (for an
    incident) on the donor pool whose GPUs the preemption freed.

    Quota is checked again before a home bind: it was checked when the job was nominated, but
    jobs of its queue may have bound since (after it in the same walk, or while it waited).
    Incident capacity in a donor pool is not charged to the queue, so it stays open to the job;
    a job its quota no longer admits at home and that has no donor pool loses its nomination
    and waits in its queue (where the walk reports the quota)."""
    led = st.core.ledger
    for jid, nom in list(st.claims.nominations.items()):
        rec = st.book.records[jid]
        if rec.home != p or rec.state is not JobState.PENDING:
            continue
        if st.book.waiting_on(nom):
            st.reasons.set_job(jid, Reason.WAITING_PREEMPTION, st.book.waiting_for(nom.victims))
            continue
        charge = charge_milli(rec.job, st.core.cluster, p)
        admitted = quota_blocks(st.core.cluster, led, rec.queue, charge) is None
        r = st.core.engine.place(led, rec.job, p) if admitted else None
        if isinstance(r, Placed):
            bind(st, rec, p, r, Reason.FITS)
        elif not _try_nominated(st, rec, nom.pools, nom.incident):
            # the capacity went elsewhere (or its victims were not stopped after all): the job
            # is walked again this cycle, so that its reason is true and protection looks again
            del st.claims.nominations[jid]
            st.reasons.forget(jid)
            st.walk_again.add(p)


def place_partition(st: Placing, p: str) -> bool:
    """Place what fits of partition ``p``'s queue. True when some job waits for capacity (or a
    serving job for admission: what lending and protection then look at)."""
    core, claims, reasons = st.core, st.claims, st.reasons
    led, queues, cluster = core.ledger, core.queues, core.cluster
    res = _valid(st, p)
    held = _hold(st, res)
    starved = False

    skips: dict[ShapeKey, int] = {}
    whole_only = cluster.partitions[p].sharing is SharingMode.EXCLUSIVE
    backfills = cluster.partitions[p].backfill  # off: reserved GPUs wait for the gang alone
    restricted = False
    walk = queues.walk(p, core.share)
    while (rec := walk.next()) is not None:
        if whole_only and res is not None and not held and led.pool_free[p] == 0:
            # no free GPU, the head-of-line gang already holds its reservation and nothing
            # reserved is free to backfill into: the rest of the queue waits
            msg = _free_of(st, p)
            reasons.set_partition(
                p, Reason.NO_FIT, f"{msg}gang {res.job_id} holds the reservation ({_starts(res)})"
            )
            if res.job_id not in claims.nominations:  # (the gang is not behind itself)
                reasons.set_job(res.job_id, Reason.NO_FIT, f"{msg}GPUs reserved from {_when(res)}")
            walk.drop()
            starved = True  # every job left waits for capacity (protection must hear it)
            break
        if (
            whole_only
            and not restricted
            and res is not None
            and led.pool_free[p] == 0
            and not ahead(st.core, rec, res)
            and len(held) < len(res.gpus)
        ):
            # the only free GPUs are reserved ones, too few for the gang: from here on only a
            # job that may take them (backfill) or needs no GPU can bind; every other shape
            # would just be told it waits for the gang, so the walk leaves them out
            restricted = True
            keep = may_pass_holds(st.core, res)
            msg = f"GPUs reserved for gang {res.job_id} (starts {_starts(res)})"
            reasons.set_partition(p, Reason.RESERVED_FOR_GANG, msg)
            walk.restrict(keep)
            if not keep(queues.shape_of(rec.job.id)):
                walk.drop()
                continue
        job = rec.job
        if job.id in claims.nominations:  # waits for its victims (place_nominated)
            walk.skip()
            continue
        sk = queues.shape_of(job.id)
        est_ok = (
            res is not None
            and backfills
            and res.start != INF  # start unknown: any backfill could delay the gang
            and (planned := job.planned_runtime_s) is not None
            and core.now + planned <= res.start
        )
        refused = first_refusal(core, rec, charge_milli(job, cluster, p))
        if refused is not None:
            rule, why = refused
            # serving refused at home may still get incident capacity: protection must hear
            starved |= job.workload_class is WorkloadClass.SERVING
            if rule.per_shape:
                reasons.set_shape(sk, rule.reason, why)
                walk.drop()
            else:
                reasons.set_job(job.id, rule.reason, why)
                walk.skip()
            continue
        is_gang = res is not None and job.id == res.job_id
        if is_gang:
            _unhold(st, held)
            held = []
        r = core.engine.place(led, job, p, request_id=queues.request_of(job.id))
        if isinstance(r, Placed):
            bind(st, rec, p, r, Reason.FITS)
            walk.placed()
            if is_gang:
                claims.reservations.pop(p, None)
                res = None
            continue
        if is_gang and res is not None:
            held = _hold(st, res)
            if r.reason in CAPACITY:  # the gang keeps its reservation; it is not behind itself
                _holds_reservation(st, rec, sk, r, res)
                starved = True
                walk.drop()
                continue
        if held and res is not None and r.reason in CAPACITY:
            outcome = _past_holds(st, rec, p, res, held, est_ok)
            if outcome is not None:
                held = outcome
                res = claims.reservations.get(p)  # a higher-priority job may have ended it
                walk.placed()
                continue
            msg = f"GPUs reserved for gang {res.job_id} (starts {_starts(res)})"
            reasons.set_shape(sk, Reason.RESERVED_FOR_GANG, msg)
            if _may_backfill_later(st, sk, res, skips):
                walk.skip()  # a shorter estimate further down this shape may still backfill
            else:
                walk.drop()
            continue
        if (
            r.reason in CAPACITY
            and (res is None or ahead(st.core, rec, res))
            and reservable(core, job, p)
        ):
            _unhold(st, held)
            claims.reservations.pop(p, None)
            res = reserve(core, st.book, rec, p)
            held = _hold(st, res)
            if res is not None:
                claims.reservations[p] = res
                st.reserved.add(p)
                _holds_reservation(st, rec, sk, r, res)
                starved = True
                walk.drop()
                continue
        if cluster.partitions[p].sharing is SharingMode.MIG and r.reason in CAPACITY:
            recut = _recut(st, rec, sk, r, walk)
            if recut is None:
                continue
            r = recut
        reasons.set_shape(sk, r.reason, r.message)
        reasons.forget(job.id)
        walk.drop()
        if r.reason in CAPACITY:
            starved = True
    _unhold(st, held)
    return starved


def _recut(st: Placing, rec: JobRecord, sk: ShapeKey, r: NotPlaced, walk: Walk) -> NotPlaced | None:
    """A dynamic-MIG job that did not fit: it waits for a re-cut (None: the walk moved on), or
    ``r`` with why no re-cut helps."""
    no_cut = repartition_for(st.core, st.mig, st.reasons, rec, st.out)
    if no_cut is None:
        st.reasons.set_shape(sk, Reason.RECONFIGURING, "waiting for a MIG re-partition")
        walk.drop()  # one re-cut per shape per cycle: the next one comes with the next cycle
        return None
    return NotPlaced(r.reason, f"{r.message}; {no_cut}") if no_cut else r


MAX_BACKFILL_SKIPS = 64  # jobs of one shape tried per cycle for backfill past the first


def _may_backfill_later(
    st: Placing, sk: ShapeKey, res: Reservation, skips: dict[ShapeKey, int]
) -> bool:
    """Jobs of a shape share an estimate bucket (est in (2^(b-1), 2^b]); if even the bucket's
    shortest estimate could end before the gang starts, later jobs of the shape may backfill."""
    bucket = st.core.queues.bucket(sk)
    if bucket is None or res.start == INF or not st.core.cluster.partitions[res.pool].backfill:
        return False
    if st.core.now + 2.0 ** (bucket - 1) > res.start or skips.get(sk, 0) >= MAX_BACKFILL_SKIPS:
        return False
    skips[sk] = skips.get(sk, 0) + 1
    return True


def _holds_reservation(
    st: Placing, rec: JobRecord, shape: int, r: NotPlaced, res: Reservation
) -> None:
    """The gang waits with its reservation; jobs of its shape wait behind it."""
    st.reasons.set_job(rec.job.id, r.reason, f"{r.message}; GPUs reserved from {_when(res)}")
    st.reasons.set_shape(shape, r.reason, f"behind gang {rec.job.id}, which holds the reservation")


def _free_of(st: Placing, p: str) -> str:
    led = st.core.ledger
    n = len(st.core.cluster.partition_gpus[p])
    closed = closed_note(st.core, p)  # drained nodes and maintenance (sched/drains.py)
    return f"partition {p} has {led.pool_free[p]} of {n} GPUs free{held_for(led, p)}{closed}; "


def _starts(res: Reservation) -> str:
    return _when(res) if res.start == INF else f"by {_when(res)}"


def _when(res: Reservation) -> str:
    if res.start != INF:
        return f"t={res.start:g}"
    return f"when running jobs end: {res.overran}" if res.overran else "when running jobs end"


def _past_holds(
    st: Placing, rec: JobRecord, p: str, res: Reservation, held: list[int], est_ok: bool
) -> list[int] | None:
    """Would ``rec`` fit without the reservation's holds, and may it take them? If so bind it
    (ahead of the gang -- ``ahead`` --, or backfill that ends before the gang's start) and return
    the new holds; otherwise leave everything as it was and return None."""
    higher = ahead(st.core, rec, res)
    if not (higher or est_ok):
        return None  # it may not take reserved GPUs whatever they would do for it
    led = st.core.ledger
    m = led.mark()
    _unhold(st, held)
    r = st.core.engine.place(led, rec.job, p)
    if isinstance(r, Placed):
        reason = Reason.FITS if higher else Reason.BACKFILL
        msg = "" if higher else f"ends before gang {res.job_id} starts at t={res.start:g}"
        if higher and rec.job.priority == res.priority and ahead_by_share(st.core, rec.queue, res):
            msg = f"queue {rec.queue} is ahead of gang {res.job_id}'s queue by fair share"
        bind(st, rec, p, r, reason, msg)
        led.commit(m)
        if higher:
            del st.claims.reservations[p]
            return []
        # the gang's start now counts on this job ending by its estimate too: if it runs past
        # it, the start is planned again and the job named ("reserved from t=1000" stayed)
        end = rec.expected_end(st.core.now)
        if end < INF:
            counted = tuple(sorted((*res.counted, (end, rec.job.id))))
            res = st.claims.reservations[p] = replace(res, counted=counted)
        held = _hold(st, res)
        if res.job_id not in st.claims.nominations:  # (its free GPUs were counted before)
            st.reasons.set_job(
                res.job_id, Reason.NO_FIT, f"{_free_of(st, p)}GPUs reserved from {_when(res)}"
            )
        return held
    led.rollback(m)
    return None


def _try_nominated(st: Placing, rec: JobRecord, pools: tuple[str, ...], incident: bool) -> bool:
    for pool in pools:
        if pool == rec.home:
            continue
        r = st.core.engine.place(st.core.ledger, rec.job, pool)
        if isinstance(r, Placed):
            msg = f"on GPUs of {pool} freed by incident preemption"
            bind(st, rec, pool, r, Reason.INCIDENT, msg, incident=incident)
            return True
    return False
