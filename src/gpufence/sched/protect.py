"""Phase 6 of a cycle: take capacity back for waiting work -- reclaim what a fence lent out,
then (serving only) budgeted incident preemption of checkpointable work.

Both start a handshake: victims get a Notice with a deadline; a CheckpointAck or the deadline
turns it into a Stop; the GPUs come back when the front end reports JobStopped.

When it runs (``protect``): after a placement pass with capacity failures that changed the
picture (new waiting jobs, capacity back in its pool or a donor pool, lending, notices), or when
an earlier run said it could find more by then (a victim ages past its minimum runtime, a
budget slot frees up).

Demand is handled as a batch per partition: the waiting jobs are walked in scheduling order inside
one ledger fork; each job's victims are searched with the earlier jobs already (tentatively)
placed, so a surge of ten replicas takes exactly the capacity ten replicas need, and every job
of the batch waits for the victims it depends on. Victim search: ``sched/victims.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufence.model.decisions import Decision, Reason
from gpufence.model.job import WorkloadClass
from gpufence.model.partition import PreemptionMode, PreemptionPolicy, SharingMode
from gpufence.sched.admission import quota_blocks
from gpufence.sched.book import JobBook
from gpufence.sched.budget_windows import merged
from gpufence.sched.context import Claims, Core, Nomination
from gpufence.sched.jobs import JobRecord, JobState
from gpufence.sched.place import CAPACITY
from gpufence.sched.reasons import PendingReasons
from gpufence.sched.victims import (
    eligible,
    first_to_age,
    place_tentatively,
    running,
    touches,
    victims_for,
)
from gpufence.state.ledger import charge_milli

INF = float("inf")
MAX_BATCH = 256  # waiting jobs considered per partition per cycle
MAX_YOUNG = 32  # candidates looked at when saying that victims are too young to be preempted


@dataclass(slots=True)
class ProtectionState:
    """Per partition: incident preemptions in the budget window, when protection should look
    again by itself, and the picture it last looked at."""

    times: dict[str, deque[float]] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    seen: dict[str, tuple[int, int, int, int, int, int]] = field(default_factory=dict)
    unserved: dict[str, bool] = field(default_factory=dict)  # jobs it could not help last time
    # per partition: (noticed, stopping) jobs near it, as of ``inflight_key``
    inflight: dict[str, tuple[int, int]] = field(default_factory=dict)
    inflight_key: tuple[int, int, int] = (-1, -1, -1)

    def restore(self, saved: tuple[tuple[str, tuple[float, ...]], ...], now: float) -> None:
        """Take back the budget windows a front end saved before a restart (with any made
        since), so the restart does not refill them. Times not finite or after ``now`` are
        not preemptions this state could have made: ignored."""
        for p, times in saved:
            window = merged(self.times.get(p, ()), times, now)
            if window:
                self.times[p] = window


@dataclass(slots=True)
class Protecting:
    """What protection may touch: the core, the job book (notices), the claims (nominations),
    pending reasons and its own state; ``out`` collects the phase's decisions."""

    core: Core
    book: JobBook
    claims: Claims
    reasons: PendingReasons
    state: ProtectionState
    out: list[Decision] = field(default_factory=list)


def protect(st: Protecting, failed: dict[str, bool]) -> list[Decision]:
    """Every partition that lent capacity out or may preempt, and has work waiting, when it is
    due (see the module docstring)."""
    core = st.core
    led = core.ledger
    for p, part in core.cluster.partitions.items():
        lent = led.lent[p] > 0
        incident = part.preemption.mode is not PreemptionMode.OFF
        if not (lent or incident) or not core.queues.shapes[p]:
            continue
        picture = (
            core.queues.added[p],
            led.freed[p] + sum(_freed_usable(core, d) for d in part.preemption.from_partitions),
            led.lent[p],
            # jobs noticed, and victims told to stop (the GPUs held for the job one was noticed
            # for now show in the walk, which may tell a job behind that gang it waits for
            # capacity) -- those whose GPUs a placement for ``p`` could use: an idle session
            # warned in another fence changes nothing here
            *_inflight_near(st, p),
            # a node failing: the jobs nominated first may no longer fit on what is coming
            # back, which is then left for the others
            led.nodes_down,
        )
        due = core.now >= st.state.after.get(p, 0.0)
        # (a changed picture matters after a walk that left jobs waiting, or when jobs it
        # could not help last time still wait: victims may have appeared in a donor pool)
        wanted = failed.get(p) or st.state.unserved.get(p)
        if not due and (not wanted or st.state.seen.get(p) == picture):
            continue
        st.state.seen[p] = picture
        st.state.after[p] = INF
        waiting = _gather(st, p, lent)
        st.state.unserved[p] = bool(waiting) and protect_partition(st, p, waiting)
    return st.out


def _inflight_near(st: Protecting, p: str) -> tuple[int, int]:
    """How many noticed and how many stopping jobs hold something a placement in ``p`` or its
    donor pools could use (recounted only after the notices or stops changed)."""
    book, led = st.book, st.core.ledger
    key = (book.inflight_changes, len(book.noticed), len(book.stopping))
    memo = st.state.inflight
    if st.state.inflight_key != key:
        memo.clear()
        st.state.inflight_key = key
    got = memo.get(p)
    if got is None:
        part = st.core.cluster.partitions[p]
        pools = {p, *part.preemption.from_partitions}
        allocs = led.allocs

        def near(jobs: dict[str, None]) -> int:
            held = (allocs.get(j) for j in jobs)
            return sum(1 for a in held if a is not None and touches(led, a, pools))

        got = memo[p] = (near(book.noticed), near(book.stopping))
    return got


def _freed_usable(core: Core, pool: str) -> int:
    """A donor pool's releases, as far as they can matter to protection: a whole-GPU pool
    with no GPU free now (its own walk took what came back) has nothing a serving job could
    be placed on without victims, whatever it released; victims on their way back are
    counted by the notices in the picture."""
    led = core.ledger
    if core.cluster.partitions[pool].sharing is SharingMode.EXCLUSIVE and not led.pool_free[pool]:
        return -1
    return led.freed[pool]


def _shares_now(core: Core) -> Callable[[str], float]:
    """Each queue's fair share, computed once: the ledger does not change while a batch is
    gathered, and the walk asks for a queue's share at every step."""
    shares: dict[str, float] = {}

    def share(q: str) -> float:
        got = shares.get(q)
        if got is None:
            got = shares[q] = core.share(q)
        return got

    return share


_LOOKS = frozenset((*CAPACITY, Reason.PREEMPTION_BUDGET, Reason.MIN_RUNTIME))


def _gather(st: Protecting, p: str, lent: bool) -> list[JobRecord]:
    """The first ``MAX_BATCH`` jobs of ``p`` in scheduling order that protection should look
    at: not nominated yet, serving unless ``p`` lent capacity out, and waiting for capacity
    (or for the budget, or for victims to age), or -- serving -- for quota at home: incident
    capacity freed in a donor pool is not charged to its queue. A job not yet considered
    ("queued", no reason) waits for the placement pass."""
    queues, reasons, noms = st.core.queues, st.reasons, st.claims.nominations
    serving_cls = WorkloadClass.SERVING
    out: list[JobRecord] = []
    for rec in queues.ordered(p, _shares_now(st.core)):
        job = rec.job
        serving = job.workload_class is serving_cls
        if not (lent or serving) or job.id in noms:
            continue
        why = reasons.newest(job.id, queues.shape_of(job.id), rec.home)
        if why is None:
            continue
        looks = serving if why.reason is Reason.QUOTA else why.reason in _LOOKS
        if looks:
            out.append(rec)
            if len(out) == MAX_BATCH:
                break
    return out


@dataclass(slots=True)
class _Batch:
    """One batch of protection in partition ``p``: what its jobs decided so far (victims
    chosen, the plan of notices, who waits for what) and what it computes once."""

    p: str
    pol: PreemptionPolicy
    times: deque[float]  # incident preemptions in the budget window
    # victims already noticed or chosen in this batch -> the pool their GPUs come back to
    inflight: dict[str, str]
    budget_left: int
    lent_out: bool
    taken: dict[str, None] = field(default_factory=dict)  # victims chosen, in order
    # (job, its victims, the pool it then runs in, why): noticed once the batch is decided
    plan: list[tuple[JobRecord, tuple[str, ...], str, Reason]] = field(default_factory=list)
    # jobs that wait for victims on their way back, told so once this batch's notices are out
    # (told before, a victim chosen earlier in the batch was not yet noticed: "waiting for
    # nothing to stop")
    waits: list[tuple[JobRecord, dict[str, None]]] = field(default_factory=list)
    counted: int = 0  # incident preemptions this batch plans
    budget_hit: list[JobRecord] = field(default_factory=list)
    # candidate victims, in preference order, computed once per batch (they only shrink)
    lent_cands: list[str] | None = None
    donor_cands: dict[str, list[str]] = field(default_factory=dict)
    young_cands: dict[str, list[str]] = field(default_factory=dict)  # for ``_too_young``
    # request shapes no victim set can help this cycle, and why, when the reason is not plain
    hopeless: dict[int, tuple[Reason, str] | None] = field(default_factory=dict)
    # request shape -> ``changes`` when a job of it ran out of budget: until the batch changes
    # the fork (a placement, a victim search that found victims), the next one does too
    spent: dict[int, int] = field(default_factory=dict)
    changes: int = 0


def protect_partition(st: Protecting, p: str, waiting: list[JobRecord]) -> bool:
    """Reclaim lent capacity, then (for serving) preempt in an incident, for ``waiting`` jobs.
    True when some of them could not be helped (no victims, or out of budget).

    Each job is decided in the batch's fork (``_consider``: it waits for capacity on its way
    back, gets lent GPUs reclaimed or victims preempted, waits for the budget, or is told why
    nothing can help it); then the batch's plan is carried out (``_carry_out``: notices,
    nominations, reasons)."""
    core = st.core
    led = core.ledger
    b = _open_batch(st, p)
    pools = {p, *b.pol.from_partitions}  # where this batch places (and so what it can use)
    with led.fork():
        for v in b.inflight:  # capacity already on its way back counts as free
            if touches(led, led.allocs[v], pools):  # (idle sessions elsewhere need no undo)
                led.release(v)
        # ... except what the jobs already waiting for it will take: they go first
        _place_nominated(st, pools)
        for rec in waiting[:MAX_BATCH]:
            if rec.job.id in st.claims.nominations or rec.state is not JobState.PENDING:
                continue
            _consider(st, b, rec)
    unserved = bool(b.budget_hit or b.hopeless)
    st.state.after[p] = _next_chance(core, st.book, b.pol, b.times, unserved)
    _carry_out(st, b)
    return unserved


def _open_batch(st: Protecting, p: str) -> _Batch:
    core = st.core
    led = core.ledger
    pol = core.cluster.partitions[p].preemption
    times = st.state.times.setdefault(p, deque())
    while times and times[0] <= core.now - pol.window_s:
        times.popleft()
    inflight = {v: led.allocs[v].pool for v in st.book.on_the_way_back() if v in led.allocs}
    on_demand = pol.mode is PreemptionMode.ON_DEMAND
    budget_left = (pol.budget - len(times)) if not on_demand else 1 << 30
    return _Batch(p, pol, times, inflight, budget_left, led.lent[p] > 0)


def _consider(st: Protecting, b: _Batch, rec: JobRecord) -> None:
    """Decide what protection does for ``rec``, in the batch's fork (see protect_partition)."""
    core, reasons = st.core, st.reasons
    shape = core.queues.request_of(rec.job.id)
    if shape in b.hopeless:
        if (blocker := b.hopeless[shape]) is not None:
            reasons.set_job(rec.job.id, *blocker)
        return
    if b.spent.get(shape) == b.changes:
        b.budget_hit.append(rec)
        return
    # the walk admitted it, but jobs of its queue may have bound after it (and earlier jobs
    # of this batch are placed in the fork): what would be charged to the queue (a home
    # placement, lent GPUs reclaimed for it) needs the quota it has now. Capacity freed by
    # incident preemption in a donor pool is not charged.
    blocked = quota_blocks(
        core.cluster, core.ledger, rec.queue, charge_milli(rec.job, core.cluster, b.p)
    )
    if blocked is not None:
        reasons.set_job(rec.job.id, Reason.QUOTA, blocked)
    elif place_tentatively(core, rec, b.p):
        # capacity on its way back covers it: it waits for that
        _nominate(st, b, rec, {v: None for v, vp in b.inflight.items() if vp == b.p}, b.p, False)
        return
    covered = _covered_elsewhere(core, rec, b.pol, b.inflight)
    if covered is not None:
        _nominate(st, b, rec, covered[1], covered[0], True)
        return
    if b.lent_out and blocked is None and _reclaim_lent(st, b, rec):
        return
    serving = rec.job.workload_class is WorkloadClass.SERVING
    if not serving or b.pol.mode is PreemptionMode.OFF:
        b.hopeless[shape] = None
    elif b.counted >= b.budget_left:
        b.budget_hit.append(rec)
        b.spent[shape] = b.changes
    else:
        _preempt_for(st, b, rec, shape)


def _nominate(
    st: Protecting, b: _Batch, rec: JobRecord, coming: dict[str, None], pool: str, incident: bool
) -> None:
    """``rec`` waits for the victims already on their way back (``coming``), then runs in
    ``pool``."""
    b.changes += 1
    st.claims.nominations[rec.job.id] = Nomination(coming, (pool,), incident)
    b.waits.append((rec, coming))


def _reclaim_lent(st: Protecting, b: _Batch, rec: JobRecord) -> bool:
    """Victims among the jobs running on GPUs ``b.p`` lent out that make room for ``rec`` at
    home, planned for reclaim; False when there are none."""
    core, led = st.core, st.core.ledger
    if b.lent_cands is None:
        b.lent_cands = running(core, st.book, lambda r: led.allocs[r.job.id].lent_from == b.p)
    got = victims_for(core, rec, b.p, [v for v in b.lent_cands if v not in b.taken])
    if got is None:
        return False
    b.changes += 1
    b.taken.update(dict.fromkeys(got))
    b.inflight.update(dict.fromkeys(got, b.p))
    b.plan.append((rec, tuple(b.taken), b.p, Reason.LENT_RECLAIM))
    return True


def _preempt_for(st: Protecting, b: _Batch, rec: JobRecord, shape: int) -> None:
    """Incident (or on-demand) victims in the first donor pool that makes room for serving
    ``rec`` within the budget; else why none can: over the budget, or victims too young."""
    core, led, pol = st.core, st.core.ledger, b.pol
    for pool in pol.from_partitions:
        if pool not in b.donor_cands:
            b.donor_cands[pool] = running(core, st.book, eligible(core, pol, pool), pool)
        cands = [v for v in b.donor_cands[pool] if v not in b.taken]
        mark = led.mark()
        got = victims_for(core, rec, pool, cands)
        if got is None:
            led.commit(mark)  # (nothing changed)
            continue
        if b.counted + len(got) > b.budget_left:
            led.rollback(mark)  # over budget: its victims stay candidates of the rest
            if len(got) > pol.budget:  # not even a fresh window would pay for it
                beyond = _beyond_budget(b.p, pol, got)
                b.hopeless[shape] = (Reason.PREEMPTION_BUDGET, beyond)
                st.reasons.set_job(rec.job.id, Reason.PREEMPTION_BUDGET, beyond)
            else:
                b.budget_hit.append(rec)
            return
        led.commit(mark)
        b.changes += 1  # the victims are released and the job placed in the fork
        b.counted += len(got)
        b.taken.update(dict.fromkeys(got))
        b.inflight.update(dict.fromkeys(got, pool))
        on_demand = pol.mode is PreemptionMode.ON_DEMAND
        reason = Reason.ON_DEMAND_PREEMPTION if on_demand else Reason.INCIDENT_PREEMPTION
        b.plan.append((rec, tuple(b.taken), pool, reason))
        return
    young = _too_young(core, st.book, pol, rec, b.taken, b.young_cands)
    b.hopeless[shape] = (Reason.MIN_RUNTIME, young) if young is not None else None
    if young is not None:
        st.reasons.set_job(rec.job.id, Reason.MIN_RUNTIME, young)


def _carry_out(st: Protecting, b: _Batch) -> None:
    """The batch's decisions take effect: the jobs out of budget are told so, the planned
    victims get their notices, the jobs they make room for are nominated, and every job that
    waits for victims is told which."""
    pol, times = b.pol, b.times
    if b.budget_hit:
        st.reasons.set_jobs(
            [rec.job.id for rec in b.budget_hit],
            Reason.PREEMPTION_BUDGET,
            f"fence {b.p} is full; incident preemption budget spent "
            f"({len(times) + b.counted} of {pol.budget} in {pol.window_s:g} s)",
        )
    noticed: dict[str, None] = {}
    for rec, victims, pool, reason in b.plan:
        for v in victims:
            if v in noticed or v in st.book.noticed:
                continue
            noticed[v] = None
            _notice_victim(st, b, rec, v, reason)
        incident = reason is not Reason.LENT_RECLAIM
        st.claims.nominations[rec.job.id] = Nomination(dict.fromkeys(victims), (pool,), incident)
        b.waits.append((rec, dict.fromkeys(victims)))
    for rec, on_the_way in b.waits:
        _waits(st, rec, on_the_way)


def _notice_victim(st: Protecting, b: _Batch, rec: JobRecord, v: str, reason: Reason) -> None:
    p = b.p
    if reason is Reason.LENT_RECLAIM:
        vrec = st.book.records[v]
        rule = next(r for r in st.core.cluster.partitions[p].lending if vrec.home in r.to)
        why = f"partition {p} reclaims its lent GPUs for {rec.job.id}"
        _notice(st, v, reason, rule.reclaim_deadline_s, False, why)
    else:
        b.times.append(st.core.now)
        why = f"serving job {rec.job.id} needs GPUs its fence {p} cannot hold"
        _notice(st, v, reason, b.pol.grace_s, True, why)


def _beyond_budget(p: str, pol: PreemptionPolicy, victims: list[str]) -> str:
    """Why a job whose victims outnumber the whole budget waits: no budget window, spent or
    not, pays for them, so waiting for a slot to free up would be in vain."""
    return (
        f"fence {p} is full; making room for it takes {len(victims)} incident preemptions "
        f"({', '.join(victims)}) and the budget allows {pol.budget} in {pol.window_s:g} s: "
        "incident preemption cannot serve it (it starts when capacity frees up; raise "
        "preemption.budget or use smaller replicas)"
    )


def _too_young(
    core: Core,
    book: JobBook,
    pol: PreemptionPolicy,
    rec: JobRecord,
    taken: dict[str, None],
    cands_of: dict[str, list[str]],
) -> str | None:
    """When no victim may be preempted for ``rec`` only because the candidates have not run
    ``min_runtime_s`` yet: which would make room, and from when they may be preempted.
    ``cands_of``: the batch's candidates per pool, in preference order (computed once: while
    a batch runs no job starts or gets a notice, and what it releases is in ``taken``)."""
    if pol.mode is PreemptionMode.OFF or pol.min_runtime_s <= 0:
        return None
    any_job = pol.mode is PreemptionMode.ON_DEMAND
    led = core.ledger
    for pool in pol.from_partitions:

        def young(r: JobRecord, pool: str = pool) -> bool:
            a = led.allocs[r.job.id]
            serving = r.job.workload_class is WorkloadClass.SERVING
            return a.pool == pool and not serving and (any_job or r.job.checkpointable)

        # (a bounded look: the reason names the blocker; it must not cost a victim search over
        # every job of a large donor pool on each cycle protection runs)
        if pool not in cands_of:
            cands_of[pool] = running(core, book, young, pool)
        cands = [v for v in cands_of[pool] if v not in taken][:MAX_YOUNG]
        with led.fork():
            got = victims_for(core, rec, pool, cands)
        if got:
            at = max(book.records[v].started_at or 0.0 for v in got) + pol.min_runtime_s
            return (
                f"preempting {', '.join(got)} in {pool} would make room, but jobs run at "
                f"least min_runtime_s {pol.min_runtime_s:g} before they are preempted "
                f"(these may be from t={at:g})"
            )
    return None


def _place_nominated(st: Protecting, pools: set[str]) -> None:
    """In protection's fork: the jobs already nominated (waiting for victims noticed, or about
    to bind on what is free) take their capacity first, so that it is not counted twice."""
    book, core = st.book, st.core
    for jid, nom in st.claims.nominations.items():
        if book.records[jid].state is not JobState.PENDING:
            continue
        if not any(q in pools for q in nom.pools):
            continue
        rec = book.records[jid]
        for q in nom.pools:
            if place_tentatively(core, rec, q):
                break


def _waits(st: Protecting, rec: JobRecord, victims: dict[str, None]) -> None:
    st.reasons.set_job(rec.job.id, Reason.WAITING_PREEMPTION, st.book.waiting_for(victims))


def _notice(
    st: Protecting, victim: str, reason: Reason, grace: float, counted: bool, why: str
) -> None:
    vrec = st.book.records[victim]
    st.out.append(st.book.notice(vrec, reason, st.core.now + grace, counted, why))
    if counted:
        st.book.counters.preemptions[reason] += 1
    else:
        st.book.counters.reclaims[reason] += 1


def _covered_elsewhere(
    core: Core, rec: JobRecord, pol: PreemptionPolicy, inflight: dict[str, str]
) -> tuple[str, dict[str, None]] | None:
    """A serving job that fits in a donor pool once the victims already noticed there stop."""
    if rec.job.workload_class is not WorkloadClass.SERVING or pol.mode is PreemptionMode.OFF:
        return None
    for pool in pol.from_partitions:
        if place_tentatively(core, rec, pool):
            return pool, {v: None for v, vp in inflight.items() if vp == pool}
    return None


def _next_chance(
    core: Core, book: JobBook, pol: PreemptionPolicy, times: deque[float], waiting: bool
) -> float:
    """When protection could find something it cannot find now: a budget slot frees up, or a
    running job in a donor pool ages past the minimum runtime. inf when nothing waits."""
    if not waiting or pol.mode is PreemptionMode.OFF:
        return INF
    best = INF
    incident = pol.mode is PreemptionMode.INCIDENT_ONLY
    if incident and times and len(times) >= pol.budget:
        # (no victim aging past the minimum runtime helps before a budget slot frees up)
        return times[0] + pol.window_s
    for pool in pol.from_partitions:
        aged = first_to_age(core, book, pool, pol.min_runtime_s, checkpointable_only=incident)
        if aged is not None:
            best = min(best, aged)
    return best
