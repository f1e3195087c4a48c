"""What placing (phases 4 and 5) shares: the state it may touch (``Placing``), the one way a
job binds (``bind``), admission, and the holds a walk puts on reserved or planned GPUs.

The phases themselves: ``sched/place.py`` (nominated jobs, the partition order),
``sched/partition_walk.py`` (one partition's queue, a decision per job) and ``sched/lend.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufence.model.decisions import Bind, Decision, Reason
from gpufence.sched.admission import Admission
from gpufence.sched.book import JobBook
from gpufence.sched.context import Claims, Core, Reservation
from gpufence.sched.jobs import JobRecord, JobState
from gpufence.sched.migdyn import MigWork
from gpufence.sched.placement.fit import Placed
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


def hold_reserved(st: Placing, res: Reservation | None) -> list[int]:
    """Hold the reservation's free GPUs for its gang; the GPUs held."""
    led = st.core.ledger
    if res is None or not led.pool_free[res.pool]:  # (its GPUs are its pool's: none free)
        return []
    held = [g for g in res.gpus if led.is_free(g)]
    for g in held:
        led.hold(g, res.job_id)
    return held


def release_holds(led: Ledger, held: list[int]) -> None:
    for g in held:
        led.unhold(g)
