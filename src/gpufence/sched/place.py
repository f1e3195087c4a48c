"""Phase 4 of a cycle: place each partition's queue on its own capacity, with the head-of-line
gang's reservation and backfill. This module orders the partitions and runs the nominated jobs
(those waiting for victims) first; one partition's walk, a decision per job, is
``sched/partition_walk.py``. (Phase 5, lending, is ``sched/lend.py``.)

Jobs are walked as shape heads in scheduling order (``queues.Walk``): jobs of one queue,
priority, shape and estimate bucket fit in exactly the same places, so when a head fails its
whole shape waits with the same reason (``PendingReasons.set_shape``) and a 10,000-job queue
costs O(shapes + binds) per cycle.
"""

from __future__ import annotations

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Reason
from gpufence.sched.admission import quota_blocks
from gpufence.sched.context import Nomination
from gpufence.sched.jobs import JobRecord, JobState
from gpufence.sched.partition_walk import place_partition
from gpufence.sched.placement.fit import Placed

# (what the other phases import from here, defined beside the partition walk)
from gpufence.sched.placing import CAPACITY, Placing, bind, release_holds
from gpufence.state.ledger import charge_milli

__all__ = [
    "CAPACITY",
    "PlaceMemo",
    "Placing",
    "bind",
    "hold_for_nominations",
    "place_nominated",
    "place_partition",
    "place_partitions",
    "release_holds",
]


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
        self.pools = {p: (p, *lenders) for p, lenders in self.lenders.items()}  # its and theirs

    def dirty(self, st: Placing, p: str, held: list[int]) -> bool:
        """Could anything in partition ``p``'s queue fit now that did not last cycle? Only if
        capacity came back to a pool it may use, jobs arrived, its reservation fell due, a
        waiting job's victims stopped, or the GPUs held for waiting nominated jobs (``held``,
        this cycle's) changed in its pools -- a nomination that ended (its job cancelled, say)
        gives back GPUs that no release counts."""
        core = st.core
        led = core.ledger
        pools = self.pools[p]
        gpus = core.cluster.gpus
        # (asked per partition every cycle: no generator where there is nothing to look at)
        on_hold = tuple(g for g in held if gpus[g].partition in pools) if held else ()
        freed = led.freed
        seen = (sum([freed[q] for q in pools]), core.queues.added[p], on_hold)
        res = st.claims.reservations.get(p)
        due = res is not None and (
            core.now > res.start or res.overrun(core.now, led.allocs.__contains__)
        )
        noms = st.claims.nominations
        nominated = bool(noms) and any(st.book.records[j].home == p for j in noms)
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
