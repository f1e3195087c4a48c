"""Phase 5 of a cycle: jobs that did not fit at home try the idle capacity other partitions lend
them (only to the partitions a lending rule names, only checkpointable work where the rule says
so, up to its cap). A lender with jobs of its own that failed for capacity lends nothing."""

from __future__ import annotations

from gpufence.model.decisions import Decision, Reason
from gpufence.model.job import RequestKind
from gpufence.model.partition import LendingRule, SharingMode
from gpufence.sched.admission import quota_blocks
from gpufence.sched.jobs import JobRecord
from gpufence.sched.place import Placing, bind, release_holds
from gpufence.sched.placement.fit import Placed
from gpufence.sched.queues import Walk
from gpufence.state.ledger import charge_milli


def lend(st: Placing, failed: dict[str, bool]) -> list[Decision]:
    led = st.core.ledger
    held = _hold_reservations(st, failed)
    try:
        _lend(st, failed)
    finally:
        release_holds(led, held)
    return st.out


def _hold_reservations(st: Placing, failed: dict[str, bool]) -> list[int]:
    """The free GPUs of every lender's reservation are its gang's, not idle capacity to lend:
    held while lending runs. A lender walked this cycle held them in its walk; one that was not
    (nothing changed for it) would otherwise lend them, and its gang would wait for the
    borrower's reclaim deadline instead of starting when its reservation falls due. (Only
    lenders -- partitions whose rules name one whose jobs failed for capacity: lending places
    nothing elsewhere, and a reservation holds GPUs of its own partition only.)"""
    led = st.core.ledger
    held: list[int] = []
    parts = st.core.cluster.partitions
    for res in st.claims.reservations.values():
        if not led.pool_free[res.pool]:  # no free GPU in its pool: nothing to hold
            continue
        if not any(failed.get(p) for rule in parts[res.pool].lending for p in rule.to):
            continue
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
        named = [
            (lp, rule)
            for lp, part in st.core.cluster.partitions.items()
            for rule in part.lending
            if p in rule.to
            and lp not in starved
            and lp != p
            and part.sharing is not SharingMode.MIG  # borrowers bring whole-GPU work
            # no whole GPU free in an exclusive or fractional lender: nothing to borrow
            and (part.sharing is SharingMode.TIME_SLICE or led.pool_free[lp] > 0)
        ]
        rules = [(lp, rule) for lp, rule in named if rule.cap_gpus > led.lent[lp]]
        if not rules:
            if named:  # idle GPUs there, but lent up to the cap: say so
                _capped(st, p, named)
            continue
        walk = st.core.queues.walk(p, st.core.share)
        while (rec := walk.next()) is not None:
            if rec.job.id in st.claims.nominations:
                walk.skip()
                continue
            if _over_quota(st, rec, walk, rules[0][0]):
                continue
            if _borrow(st, rec, rules):
                walk.placed()
            else:
                walk.drop()


def _borrow(st: Placing, rec: JobRecord, rules: list[tuple[str, LendingRule]]) -> bool:
    """Bind ``rec`` on the first lender that may lend it enough under its cap; else say why
    none did (only checkpointable jobs may borrow, or the caps leave too few GPUs)."""
    led, job = st.core.ledger, rec.job
    refused = []  # lenders whose rule is for checkpointable jobs only
    capped = []  # lenders whose cap leaves less than the job needs
    for lp, rule in rules:
        if rule.checkpointable_only and not job.checkpointable:
            refused.append((lp, rule.cap_gpus))
            continue
        left = rule.cap_gpus - led.lent[lp]
        r = st.core.engine.place(led, job, lp, max_gpus=left)
        if isinstance(r, Placed):
            bind(st, rec, lp, r, Reason.LENT, f"borrowing idle GPUs of {lp}", lent_from=lp)
            return True
        if left < job.total_gpus:
            capped.append((lp, rule))
    if len(refused) == len(rules):
        _not_lent(st, rec, _checkpointable_note(st, refused))
    elif capped:
        _not_lent(st, rec, _cap_note(st, capped, job.total_gpus))
    return False


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


def _checkpointable_note(st: Placing, lenders: list[tuple[str, int]]) -> str:
    """Where only checkpointable jobs may borrow: what they would lend, idle GPUs up to each
    rule's cap, less what is lent out already."""
    led = st.core.ledger
    idle = sum(min(led.pool_free[lp], max(0, cap - led.lent[lp])) for lp, cap in lenders)
    names = [lp for lp, _ in lenders]
    verb = "lends" if len(names) == 1 else "lend"
    return f"{', '.join(names)} {verb} {idle} idle GPUs to checkpointable jobs only"


def _cap_note(st: Placing, lenders: list[tuple[str, LendingRule]], needs: int) -> str:
    """Where the lenders have idle GPUs but their caps leave too few: how many each lends of
    its idle GPUs (what it lends out plus what is free), its cap, and to whom."""
    led = st.core.ledger
    said = []
    for lp, rule in lenders:
        lent, left = led.lent[lp], max(0, rule.cap_gpus - led.lent[lp])
        idle = lent + led.pool_free[lp]
        more = f"{left} more" if left else "no more"
        said.append(
            f"{lp} lends {lent} of its {idle} idle GPUs (cap {rule.cap_gpus}) to "
            f"{', '.join(rule.to)}: {more} may be lent, this job needs {needs}"
        )
    return "; ".join(said)


def _capped(st: Placing, p: str, lenders: list[tuple[str, LendingRule]]) -> None:
    """``p``'s jobs that did not fit at home, where every lender naming ``p`` has lent up to
    its cap: each shape that could borrow (checkpointable where the rule asks it) is told
    so, with the numbers."""
    walk = st.core.queues.walk(p, st.core.share)
    while (rec := walk.next()) is not None:
        if rec.job.id in st.claims.nominations:
            walk.skip()
            continue
        if _over_quota(st, rec, walk, lenders[0][0]):
            continue  # (lent GPUs would be charged to it: its quota is the blocker)
        fits = [(lp, r) for lp, r in lenders if rec.job.checkpointable or not r.checkpointable_only]
        if fits:
            _not_lent(st, rec, _cap_note(st, fits, rec.job.total_gpus))
        else:
            _not_lent(st, rec, _checkpointable_note(st, [(lp, r.cap_gpus) for lp, r in lenders]))
        walk.drop()


def _not_lent(st: Placing, rec: JobRecord, note: str) -> None:
    """A job that does not fit at home nor on what others lend: its home reason, with the
    ``note`` on lending appended (with its shape, which shares its checkpointability)."""
    queues = st.core.queues
    home = st.reasons.why(rec.job.id, queues)
    if home is not None and note in home.message:
        return  # said in an earlier cycle, and still true
    reason = home.reason if home is not None else Reason.NO_FIT
    base = home.message if home is not None else ""
    # a note of an earlier cycle whose numbers changed is replaced, not repeated
    cut = base.find("; " + note.split(" ", 1)[0] + " lend")
    base = base[:cut] if cut >= 0 else base
    message = f"{base}; {note}" if base else note
    st.reasons.set_shape(queues.shape_of(rec.job.id), reason, message)
    st.reasons.set_job(rec.job.id, reason, message)
