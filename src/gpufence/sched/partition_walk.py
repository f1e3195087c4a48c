"""One partition's queue walk (phase 4): for each job the walk reaches, one decision out of a
closed set of outcomes (``decide``), then a separate step that carries it out (``carry_out``).

  Binds      it fits: it binds (the reservation's own gang included, which ends the reservation)
  Backfills  it fits only on GPUs held for the gang: it binds there, ahead of the gang by
             priority or fair share, or as backfill that ends before the gang's start
  Reserves   a gang that does not fit holds (or keeps) the partition's one reservation; the
             jobs of its shape wait behind it
  Holds      it waits without a reason of its own this walk (nominated: it waits for victims)
  Skips      it waits with a reason, for itself or its whole shape, and the walk moves on

Deciding may try placements and move the reservation's holds (the trial is part of the
decision: a job past the holds is placed inside a ledger transaction that carrying out
commits); carrying out binds, sets pending reasons, keeps the reservation book and moves the
walk. Before a job is decided, the walk's gate (``_gate``) may end the walk (nothing free and
the gang holds its reservation) or narrow it to the shapes that may pass the holds.

Which rule reserves and who may backfill: ``sched/backfill.py``, registered in
``sched/registry.py`` (``RESERVATIONS``) beside queue order and the scorers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Reason
from gpufence.model.job import WorkloadClass
from gpufence.sched.backfill import INF
from gpufence.sched.context import Reservation
from gpufence.sched.drains import closed_note
from gpufence.sched.jobs import JobRecord
from gpufence.sched.passing import ahead, ahead_by_share, may_pass_holds
from gpufence.sched.placement.fit import NotPlaced, Placed
from gpufence.sched.placement.whole import held_for
from gpufence.sched.placing import (
    CAPACITY,
    Placing,
    bind,
    first_refusal,
    hold_reserved,
    release_holds,
)
from gpufence.sched.queues import ShapeKey, Walk
from gpufence.sched.registry import PLACERS, PlacementMode
from gpufence.state.ledger import charge_milli

MAX_BACKFILL_SKIPS = 64  # jobs of one shape tried per cycle for backfill past the first


# The outcomes, one class each (a small record is cheaper to make than one record with every
# outcome's fields, and the walk decides a quarter of a million jobs a minute under load).


@dataclass(slots=True)
class Binds:
    placed: Placed
    gang: bool  # it is the reservation's gang (the reservation ends)


@dataclass(slots=True)
class Backfills:
    reason: Reason  # FITS (ahead of the gang) or BACKFILL
    message: str
    placed: Placed
    mark: int  # the ledger transaction its trial placement opened
    ahead: bool  # ahead of the gang (the reservation ends), else backfill before its start


@dataclass(slots=True)
class Reserves:
    failed: NotPlaced  # why the gang does not fit now
    new: bool  # the reservation was made (again) in this decision


class Holds:
    """It waits for its victims; nothing to record."""


@dataclass(slots=True)
class Skips:
    reason: Reason
    message: str
    per_shape: bool = True  # the reason is its shape's (else its own)
    drop: bool = True  # its whole shape is done for this walk (else: the next job of it)
    forget: bool = False  # its own older reason goes (the shape's now speaks for it)
    starved: bool = False  # it waits for capacity (what lending and protection hear)


Choice = Binds | Backfills | Reserves | Holds | Skips
_HOLDS = Holds()


@dataclass(slots=True)
class PartitionWalk:
    """The walk of partition ``p``: the reservation as it stands, its GPUs held now, and what
    the walk found so far."""

    p: str
    walk: Walk
    res: Reservation | None
    held: list[int]
    mode: PlacementMode  # the partition's sharing mode's (sched/registry.py)
    restricted: bool = False  # only shapes that may pass the holds are walked
    starved: bool = False  # some job waits for capacity
    skips: dict[ShapeKey, int] = field(default_factory=dict)


def place_partition(st: Placing, p: str) -> bool:
    """Place what fits of partition ``p``'s queue. True when some job waits for capacity (or a
    serving job for admission: what lending and protection then look at)."""
    core = st.core
    part = core.cluster.partitions[p]
    res = _valid(st, p)
    w = PartitionWalk(
        p=p,
        walk=core.queues.walk(p, core.share),
        res=res,
        held=hold_reserved(st, res),
        mode=PLACERS[part.sharing],
    )
    while (rec := w.walk.next()) is not None:
        # (the gate matters only while a whole-GPU reservation stands: not called otherwise)
        gate = _gate(st, w, rec) if w.res is not None and w.mode.reserves else True
        if gate is None:
            break
        if gate:
            carry_out(st, w, rec, decide(st, w, rec))
    release_holds(core.ledger, w.held)
    return w.starved


def _valid(st: Placing, p: str) -> Reservation | None:
    """Partition ``p``'s reservation, planned again if its start no longer holds (None: it
    has none, or its gang left the queue or can no longer be placed)."""
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
    if not stale:
        return res
    # recompute for the same gang before anything is placed: dropping it would let the jobs
    # queued ahead of the gang take the GPUs it was about to get, and push it back
    rec = st.core.queues.records[res.job_id]
    new = st.core.reservations.reserve(st.core, st.book.records, rec, p)
    if new is None:
        del st.claims.reservations[p]
        return None
    st.claims.reservations[p] = new
    return new


def _gate(st: Placing, w: PartitionWalk, rec: JobRecord) -> bool | None:
    """Before ``rec`` is decided: None ends the walk, False moves on to the next job, True
    decides it."""
    res = w.res
    if not (w.mode.reserves and res is not None and st.core.ledger.pool_free[w.p] == 0):
        return True
    if not w.held:
        # no free GPU, the head-of-line gang already holds its reservation and nothing
        # reserved is free to backfill into: the rest of the queue waits
        msg = _free_of(st, w.p)
        why = f"{msg}gang {res.job_id} holds the reservation ({_starts(res)})"
        st.reasons.set_partition(w.p, Reason.NO_FIT, why)
        if res.job_id not in st.claims.nominations:  # (the gang is not behind itself)
            st.reasons.set_job(res.job_id, Reason.NO_FIT, f"{msg}GPUs reserved from {_when(res)}")
        w.walk.drop()
        w.starved = True  # every job left waits for capacity (protection must hear it)
        return None
    if not w.restricted and not ahead(st.core, rec, res) and len(w.held) < len(res.gpus):
        # the only free GPUs are reserved ones, too few for the gang: from here on only a
        # job that may take them (backfill) or needs no GPU can bind; every other shape
        # would just be told it waits for the gang, so the walk leaves them out
        w.restricted = True
        keep = may_pass_holds(st.core, res)
        msg = f"GPUs reserved for gang {res.job_id} (starts {_starts(res)})"
        st.reasons.set_partition(w.p, Reason.RESERVED_FOR_GANG, msg)
        w.walk.restrict(keep)
        if not keep(st.core.queues.shape_of(rec.job.id)):
            w.walk.drop()
            return False
    return True


def decide(st: Placing, w: PartitionWalk, rec: JobRecord) -> Choice:
    """What becomes of ``rec`` (see the module docstring). Tries placements; the reservation's
    holds in ``w`` follow the trial (the gang's own are let go while it tries to place)."""
    core, job = st.core, rec.job
    if job.id in st.claims.nominations:  # waits for its victims (place.place_nominated)
        return _HOLDS
    res = w.res
    refused = first_refusal(core, rec, _charge(core.cluster, rec, w.p))
    if refused is not None:
        rule, why = refused
        # serving refused at home may still get incident capacity: protection must hear
        serving = job.workload_class is WorkloadClass.SERVING
        per = rule.per_shape
        return Skips(rule.reason, why, per_shape=per, drop=per, starved=serving)
    is_gang = res is not None and job.id == res.job_id
    if is_gang:
        release_holds(core.ledger, w.held)
        w.held = []
    r = core.engine.place(core.ledger, job, w.p, request_id=core.queues.request_of(job.id))
    if isinstance(r, Placed):
        return Binds(r, is_gang)
    capacity = r.reason in CAPACITY
    if is_gang and res is not None:
        w.held = hold_reserved(st, res)
        if capacity:  # the gang keeps its reservation; it is not behind itself
            return Reserves(r, new=False)
    if w.held and res is not None and capacity:
        return _past_holds(st, w, rec, res)
    if (
        capacity
        and w.mode.reserves
        and (res is None or ahead(core, rec, res))
        and core.reservations.reservable(core, job, w.p)
    ):
        release_holds(core.ledger, w.held)
        st.claims.reservations.pop(w.p, None)
        w.res = core.reservations.reserve(core, st.book.records, rec, w.p)
        w.held = hold_reserved(st, w.res)
        if w.res is not None:
            return Reserves(r, new=True)
    if capacity and w.mode.recut is not None:
        waits = w.mode.recut(st, rec, r)
        if isinstance(waits, str):
            return Skips(Reason.RECONFIGURING, waits)
        return Skips(waits.reason, waits.message, forget=True, starved=True)
    return Skips(r.reason, r.message, forget=True, starved=capacity)


def _charge(cluster: Cluster, rec: JobRecord, pool: str) -> int:
    """``charge_milli`` of ``rec``'s job in ``pool``, kept on the record while the job and the
    cluster are the same objects (``JobRecord.charge``)."""
    kept = rec.charge
    if kept is not None and kept[0] is rec.job and kept[1] is cluster and kept[2] == pool:
        return kept[3]
    charge = charge_milli(rec.job, cluster, pool)
    rec.charge = (rec.job, cluster, pool, charge)
    return charge


def _past_holds(
    st: Placing, w: PartitionWalk, rec: JobRecord, res: Reservation
) -> Backfills | Skips:
    """``rec`` does not fit beside the reservation's holds. If it may take them (ahead of the
    gang -- ``ahead`` --, or backfill that ends before the gang's start) and fits without them,
    it binds there (``Backfills``, its trial left open for ``carry_out`` to commit); otherwise it
    waits for the gang, its shape too unless a shorter estimate further down may backfill."""
    core = st.core
    higher = ahead(core, rec, res)
    if higher or core.reservations.may_backfill(core, rec.job, res):
        led = core.ledger
        m = led.mark()
        release_holds(led, w.held)
        r = core.engine.place(led, rec.job, w.p)
        if isinstance(r, Placed):
            msg = "" if higher else f"ends before gang {res.job_id} starts at t={res.start:g}"
            if higher and rec.job.priority == res.priority and ahead_by_share(core, rec.queue, res):
                msg = f"queue {rec.queue} is ahead of gang {res.job_id}'s queue by fair share"
            reason = Reason.FITS if higher else Reason.BACKFILL
            return Backfills(reason, msg, r, m, higher)
        led.rollback(m)
    msg = f"GPUs reserved for gang {res.job_id} (starts {_starts(res)})"
    # a shorter estimate further down this shape may still backfill: the walk tries it
    later = _may_backfill_later(st, w, core.queues.shape_of(rec.job.id), res)
    return Skips(Reason.RESERVED_FOR_GANG, msg, drop=not later)


def carry_out(st: Placing, w: PartitionWalk, rec: JobRecord, c: Choice) -> None:
    """Apply the decision ``c`` for ``rec``: bind, reasons, the reservation book, the walk."""
    if isinstance(
        c, Skips
    ):  # (the most frequent first: the walk's hot path, so not a further call)
        job_id = rec.job.id
        if c.per_shape:
            st.reasons.set_shape(st.core.queues.shape_of(job_id), c.reason, c.message)
        else:
            st.reasons.set_job(job_id, c.reason, c.message)
        if c.forget:
            st.reasons.forget(job_id)
        if c.drop:
            w.walk.drop()
        else:
            w.walk.skip()
        w.starved |= c.starved
    elif isinstance(c, Holds):
        w.walk.skip()
    elif isinstance(c, Binds):
        bind(st, rec, w.p, c.placed, Reason.FITS)
        w.walk.placed()
        if c.gang:
            st.claims.reservations.pop(w.p, None)
            w.res = None
    elif isinstance(c, Backfills):
        _bind_past_holds(st, w, rec, c)
        w.res = st.claims.reservations.get(w.p)  # a higher-priority job may have ended it
        w.walk.placed()
    else:
        _keep_reservation(st, w, rec, c)


def _keep_reservation(st: Placing, w: PartitionWalk, rec: JobRecord, c: Reserves) -> None:
    """The gang holds the reservation (made in its decision, or kept); its shape waits."""
    assert w.res is not None
    if c.new:
        st.claims.reservations[w.p] = w.res
        st.reserved.add(w.p)
    _holds_reservation(st, rec, c.failed, w.res)
    w.starved = True
    w.walk.drop()


def _bind_past_holds(st: Placing, w: PartitionWalk, rec: JobRecord, c: Backfills) -> None:
    """Bind a job on the GPUs held for the gang (its trial's transaction is committed), then
    hold again what the gang still gets: nothing when the job went ahead of it (the
    reservation ends), else the reservation's GPUs that are still free."""
    assert w.res is not None
    p, res = w.p, w.res
    bind(st, rec, p, c.placed, c.reason, c.message)
    st.core.ledger.commit(c.mark)
    if c.ahead:
        del st.claims.reservations[p]
        w.held = []
        return
    # the gang's start now counts on this job ending by its estimate too: if it runs past
    # it, the start is planned again and the job named ("reserved from t=1000" stayed)
    end = rec.expected_end(st.core.now)
    if end < INF:
        counted = tuple(sorted((*res.counted, (end, rec.job.id))))
        res = st.claims.reservations[p] = replace(res, counted=counted)
    w.held = hold_reserved(st, res)
    if res.job_id not in st.claims.nominations:  # (its free GPUs were counted before)
        st.reasons.set_job(
            res.job_id, Reason.NO_FIT, f"{_free_of(st, p)}GPUs reserved from {_when(res)}"
        )


def _may_backfill_later(st: Placing, w: PartitionWalk, sk: ShapeKey, res: Reservation) -> bool:
    """Jobs of a shape share an estimate bucket (est in (2^(b-1), 2^b]); if even the bucket's
    shortest estimate could end before the gang starts, later jobs of the shape may backfill."""
    bucket = st.core.queues.bucket(sk)
    if bucket is None or res.start == INF or not st.core.cluster.partitions[res.pool].backfill:
        return False
    skips = w.skips
    if st.core.now + 2.0 ** (bucket - 1) > res.start or skips.get(sk, 0) >= MAX_BACKFILL_SKIPS:
        return False
    skips[sk] = skips.get(sk, 0) + 1
    return True


def _holds_reservation(st: Placing, rec: JobRecord, r: NotPlaced, res: Reservation) -> None:
    """The gang waits with its reservation; jobs of its shape wait behind it."""
    shape = st.core.queues.shape_of(rec.job.id)
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
