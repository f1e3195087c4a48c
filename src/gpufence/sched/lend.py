"""Phase 5 of a cycle: jobs that did not fit at home try the idle capacity other partitions lend
them (only to the partitions a lending rule names, only checkpointable work where the rule says
so, up to its cap). A lender with jobs of its own that failed for capacity lends nothing."""

from __future__ import annotations

from gpufence.model.decisions import Decision, Reason
from gpufence.model.job import RequestKind
from gpufence.model.partition import SharingMode
from gpufence.sched.admission import quota_blocks
from gpufence.sched.jobs import JobRecord
from gpufence.sched.place import Placing, bind, release_holds
from gpufence.sched.placement.fit import Placed
from gpufence.sched.queues import Walk
from gpufence.state.ledger import charge_milli


def lend(st: Placing, failed: dict[str, bool]) -> list[Decision]:
    led = st.core.ledger
    held = _hold_reservations(st)
    try:
        _lend(st, failed)
    finally:
        release_holds(led, held)
    return st.out


def _hold_reservations(st: Placing) -> list[int]:
    """The free GPUs of every partition's reservation are its gang's, not idle capacity to
    lend: held while lending runs. A lender walked this cycle held them in its walk; one that
    was not (nothing changed for it) would otherwise lend them, and its gang would wait for
    the borrower's reclaim deadline instead of starting when its reservation falls due."""
    led = st.core.ledger
    held: list[int] = []
    for res in st.claims.reservations.values():
        for g in res.gpus:
            if led.is_free(g):
                led.hold(g, res.job_id)
                held.append(g)
    return held


def _lend(st: Placing, failed: dict[str, bool]) -> None:
    led = st.core.ledger
    starved = {p for p, short in failed.items() if short}
    for p, short in failed.items():  # (in the walk's partition order, not the set's)
        if not short:
            continue
        rules = [
            (lp, rule)
            for lp, part in st.core.cluster.partitions.items()
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
        walk = st.core.queues.walk(p, st.core.share)
        while (rec := walk.next()) is not None:
            job = rec.job
            if job.id in st.claims.nominations:
                walk.skip()
                continue
            if _over_quota(st, rec, walk, rules[0][0]):
                continue
            refused = []  # lenders whose rule is for checkpointable jobs only
            for lp, rule in rules:
                if rule.checkpointable_only and not job.checkpointable:
                    refused.append((lp, rule.cap_gpus))
                    continue
                left = rule.cap_gpus - led.lent[lp]
                r = st.core.engine.place(led, job, lp, max_gpus=left)
                if isinstance(r, Placed):
                    bind(st, rec, lp, r, Reason.LENT, f"borrowing idle GPUs of {lp}", lent_from=lp)
                    walk.placed()
                    break
            else:
                if len(refused) == len(rules):
                    _not_lent(st, rec, refused)
                walk.drop()


def _over_quota(st: Placing, rec: JobRecord, walk: Walk, pool: str) -> bool:
    """Lent GPUs are charged to the borrower's quota like its own (``Ledger._book``): a job its
    quota does not admit borrows nothing, whether or not the home walk reached it this cycle.
    (A whole-GPU job is charged the same in every lender; the first one prices it.)"""
    core = st.core
    if rec.job.request.kind is RequestKind.MIG:
        return False  # (no lender is MIG: it borrows nothing, and it has no charge there)
    why = quota_blocks(
        core.cluster, core.ledger, rec.queue, charge_milli(rec.job, core.cluster, pool)
    )
    if why is None:
        return False
    st.reasons.set_shape(core.queues.shape_of(rec.job.id), Reason.QUOTA, why)
    walk.drop()
    return True


def _not_lent(st: Placing, rec: JobRecord, lenders: list[tuple[str, int]]) -> None:
    """A job that does not fit at home, where only checkpointable jobs may borrow: say so
    (with its shape, which shares its checkpointability), with what they would lend: idle
    GPUs up to each rule's cap, less what is lent out already."""
    queues = st.core.queues
    led = st.core.ledger
    home = st.reasons.why(rec.job.id, queues)
    idle = sum(min(led.pool_free[lp], max(0, cap - led.lent[lp])) for lp, cap in lenders)
    names = [lp for lp, _ in lenders]
    verb = "lends" if len(names) == 1 else "lend"
    note = f"{', '.join(names)} {verb} {idle} idle GPUs to checkpointable jobs only"
    if home is not None and note in home.message:
        return  # said in an earlier cycle, and still true
    reason = home.reason if home is not None else Reason.NO_FIT
    message = f"{home.message}; {note}" if home is not None else note
    st.reasons.set_shape(queues.shape_of(rec.job.id), reason, message)
    st.reasons.set_job(rec.job.id, reason, message)
