"""MIG defragmentation by stopping: the GPU drained for a large profile (``migdrain``) is
cleared by stopping the checkpointable jobs in the profile's way, under a budget.

A drain by attrition waits for the instances in the way to end by themselves. Where the
partition allows it (``MigConfig.defrag_budget`` > 0, a budget of its own per
``defrag_window_s``: serving's incident preemption budget is never spent on re-packing), the
jobs in the way are noticed (``Reason.MIG_DEFRAG``) when every one of them may be stopped:
checkpointable, not serving, running at least the partition's ``preemption.min_runtime_s``
(the thrash guard), not stopped for a defrag in its previous attempt, and the budget has room
for all of them. The handshake is the incident path's (``Notice`` -> ``CheckpointAck`` or the
deadline -> ``Stop`` -> ``JobStopped`` -> ``Requeue``); once the instances are gone
``migdyn`` re-cuts the GPU for the waiting job as after any drain. Where the drained GPU's
jobs may not be stopped, the drain moves to the pool's GPU whose jobs in the way may be, the
fewest first; when none may, or the budget is spent, the drain goes on by attrition and the
pending reason says why.

Runs after protection each cycle, over the pools with a drain (at most one each).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from gpufence.model import mig as migmod
from gpufence.model.decisions import Decision, Reason
from gpufence.model.job import WorkloadClass
from gpufence.model.partition import MigConfig
from gpufence.sched import migdrain
from gpufence.sched.book import JobBook
from gpufence.sched.budget_windows import merged
from gpufence.sched.context import Core
from gpufence.sched.jobs import JobState
from gpufence.sched.migdrain import Drain
from gpufence.sched.migindex import running_jobs
from gpufence.sched.placement.fit import node_admits
from gpufence.sched.placement.mig_room import starts_beside
from gpufence.sched.reasons import PendingReasons

INF = float("inf")
MAX_SCAN = 256  # GPUs of a pool looked at for a stoppable drain per cycle (bounded work)


@dataclass(slots=True)
class DefragState:
    """Per MIG pool: defrag stops in the budget window, and when a look could find more (a
    victim ages past the minimum runtime, a budget slot frees up)."""

    times: dict[str, deque[float]] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    # job stopped -> the job it was stopped for, while that one waits: a victim requeued ahead
    # of it in queue order must not re-cut the GPU made for it back for itself (ping-pong)
    stopped_for: dict[str, str] = field(default_factory=dict)

    def keeps_from(self, owner: str, job_id: str) -> bool:
        """The GPU re-cut for ``owner`` is kept from ``job_id``: it was stopped for it."""
        return self.stopped_for.get(job_id) == owner

    def next_wakeup(self, now: float) -> float | None:
        due = [t for t in self.after.values() if now < t < INF]
        return min(due) if due else None

    def restore(self, saved: tuple[tuple[str, tuple[float, ...]], ...], now: float) -> None:
        """Take back the defrag stops a front end saved before a restart (with any made since,
        ``DefragsRestored``), so the restart does not refill the budget. Times not finite or
        after ``now`` are not stops this state could have made: ignored. (The window is cut
        where the budget is read: a stop older than it frees its slot then.)"""
        for pool, times in saved:
            window = merged(self.times.get(pool, ()), times, now)
            if window:
                self.times[pool] = window


@dataclass(frozen=True, slots=True)
class _Plan:
    gpu: int
    victims: tuple[str, ...]  # to notice now
    coming: tuple[str, ...]  # in the way, already on their way out


class MigWork(Protocol):
    """What of migdyn's ``MigWork`` a defrag reads and changes (a protocol, not an import:
    migdyn holds the ``DefragState`` this module defines)."""

    made_for: dict[int, str]  # GPU -> job it was re-partitioned for
    drains: dict[str, Drain]  # MIG pool -> its GPU being drained
    defrag: DefragState


def defrag(core: Core, book: JobBook, mig: MigWork, reasons: PendingReasons) -> list[Decision]:
    """Notice the jobs in the way of each drain where the pool's budget allows it."""
    out: list[Decision] = []
    drains, st = mig.drains, mig.defrag
    for v, owner in list(st.stopped_for.items()):
        if owner not in core.queues:  # (started, or left the queue)
            del st.stopped_for[v]
    for pool, drain in list(drains.items()):
        cfg = core.cluster.partitions[pool].mig
        if cfg is None or cfg.defrag_budget <= 0:
            continue
        st.after.pop(pool, None)
        rec = book.records.get(drain.job_id)
        if rec is None or rec.state is not JobState.PENDING or migdrain.drained(core, drain):
            continue  # (ended, or nothing in the way: the next placement re-cuts it)
        d = _Defrag(core, book, reasons, mig, cfg, pool, out)
        drains[pool] = d.run(drain)
    return out


@dataclass(slots=True)
class _Defrag:
    """One pool's drain looked at: stop the jobs in its way, move it, or say why not."""

    core: Core
    book: JobBook
    reasons: PendingReasons
    mig: MigWork
    cfg: MigConfig
    pool: str
    out: list[Decision]

    def run(self, drain: Drain) -> Drain:
        """The drain as it is now (moved to another GPU where that GPU's jobs may be stopped
        and the drained one's may not)."""
        core, cfg = self.core, self.cfg
        times = self.mig.defrag.times.setdefault(self.pool, deque())
        while times and times[0] <= core.now - cfg.defrag_window_s:
            times.popleft()
        left = cfg.defrag_budget - len(times)
        min_run = core.cluster.partitions[self.pool].preemption.min_runtime_s
        plan = _plan_on(core, self.book, drain.gpu, drain.profile, min_run)
        if plan is None or len(plan.victims) > left:
            alt = _elsewhere(core, self.book, drain, min_run, cfg.defrag_budget)
            if alt is not None and len(alt.victims) <= left:
                migdrain.end_drain(core, drain)
                core.ledger.set_blocked(alt.gpu, True)
                drain = Drain(drain.job_id, alt.gpu, drain.profile)
            plan = plan or alt
        if plan is not None and len(plan.victims) <= left:
            self._stop(drain, plan, times)
        elif plan is not None:
            self._over_budget(drain, plan, times)
        else:
            self._too_young(drain, min_run)
        return drain

    def _stop(self, drain: Drain, plan: _Plan, times: deque[float]) -> None:
        core, cfg, book = self.core, self.cfg, self.book
        jid = drain.job_id
        why = f"GPU {drain.gpu} is re-packed for {drain.profile} job {jid}"
        deadline = core.now + cfg.defrag_grace_s
        for v in plan.victims:
            # a GPU once re-cut for the victim is not kept for it when it requeues (migdyn's
            # anti-ping-pong rule is for a re-cut its job has not used yet; this one was)
            for g in [g for g, j in self.mig.made_for.items() if j == v]:
                del self.mig.made_for[g]
            self.mig.defrag.stopped_for[v] = jid
            times.append(core.now)
            self.out.append(book.notice(book.records[v], Reason.MIG_DEFRAG, deadline, True, why))
            book.counters.preemptions[Reason.MIG_DEFRAG] += 1
        stops = ", ".join((*plan.coming, *plan.victims))
        msg = (
            f"GPU {drain.gpu} is drained for {drain.profile}: MIG defrag stops {stops} "
            f"(checkpointable; {len(times)} of {cfg.defrag_budget} defrag stops in "
            f"{cfg.defrag_window_s:g} s)"
        )
        self.reasons.set_job(jid, Reason.WAITING_PREEMPTION, msg)

    def _over_budget(self, drain: Drain, plan: _Plan, times: deque[float]) -> None:
        """Stoppable jobs stand in the way, but the budget left does not pay for them: the
        drain goes on by attrition until a budget slot frees up."""
        cfg = self.cfg
        n, victims = len(plan.victims), ", ".join(plan.victims)
        where = f"{victims} on GPU {plan.gpu}"
        if n > cfg.defrag_budget:  # no window, spent or not, pays for it
            self.mig.defrag.after[self.pool] = INF
            head = (
                f"MIG defrag cannot pay for it (stopping {where} takes {n}; the budget allows "
                f"{cfg.defrag_budget} in {cfg.defrag_window_s:g} s)"
            )
        else:
            self.mig.defrag.after[self.pool] = times[0] + cfg.defrag_window_s if times else INF
            head = (
                f"MIG defrag budget spent ({len(times)} of {cfg.defrag_budget} in "
                f"{cfg.defrag_window_s:g} s; stopping {where} takes {n})"
            )
        attrition = migdrain.waiting_for(self.core, drain)
        self.reasons.set_job(drain.job_id, Reason.PREEMPTION_BUDGET, f"{head}: {attrition}")

    def _too_young(self, drain: Drain, min_run: float) -> None:
        """Only the age of the jobs in the way keeps the defrag off: say from when it may."""
        young = _first_to_age(self.core, self.book, drain, min_run)
        if young is None:
            return  # (nothing stoppable in the way: the drain's own reason, attrition, stands)
        self.mig.defrag.after[self.pool] = young
        attrition = migdrain.waiting_for(self.core, drain)
        self.reasons.set_job(
            drain.job_id,
            Reason.MIN_RUNTIME,
            f"{attrition} (MIG defrag may stop them from t={young:g}: jobs run at least "
            f"min_runtime_s {min_run:g} before they are stopped)",
        )


def _stoppable(book: JobBook, jid: str, now: float, min_run: float) -> bool:
    rec = book.records[jid]
    job = rec.job
    return (
        rec.state is JobState.RUNNING
        and job.checkpointable
        and job.workload_class is not WorkloadClass.SERVING
        and rec.notice is None
        and rec.started_at is not None
        and now - rec.started_at >= min_run
        and rec.stop_reason is not Reason.MIG_DEFRAG  # (once in a row: no ping-pong)
    )


def _on_the_way(book: JobBook, jid: str) -> bool:
    """Told to stop, or noticed to checkpoint (an idle session's warning may be withdrawn)."""
    n = book.records[jid].notice
    return jid in book.stopping or (n is not None and n.reason is not Reason.IDLE)


def _way(core: Core, g: int, profile: str) -> list[tuple[int, tuple[str, ...]]]:
    """Per start of ``profile`` where clearing the jobs over it makes it fit on GPU ``g``:
    (start, those jobs). Only starts where their instances hold fewer compute slices than the
    profile: a defrag makes room for more than it stops, never swaps like for like (a 4g
    stopped for a 4g would then stop the next one for itself)."""
    st = core.ledger.mig[g]
    key = ("defrag-way", profile)
    got = st.memo.get(key)  # (the GPU's memo is emptied when its instances or jobs change)
    if got is not None:
        return got  # type: ignore[return-value]
    model = core.cluster.gpu_type_of(g).mig_model
    assert model is not None
    profiles = migmod.profiles_for(model)
    p = profiles[profile]
    held = running_jobs(core, g)
    out: list[tuple[int, tuple[str, ...]]] = []
    st.memo[key] = out
    for s in p.starts:
        span = migmod.span_mask(s, p.mem_slices)
        over = [migmod.span_mask(i.start, profiles[i.profile].mem_slices) & span for i, _ in held]
        rest = tuple(i for (i, _), o in zip(held, over, strict=True) if not o)
        if s not in starts_beside(model, rest, profile):
            continue  # (the per-GPU caps block it even with the way cleared)
        way = [(i, j) for (i, j), o in zip(held, over, strict=True) if o]
        if sum(profiles[i.profile].compute_slices for i, _ in way) < p.compute_slices:
            out.append((s, tuple(dict.fromkeys(j for _, j in way))))
    return out


def _plan_on(core: Core, book: JobBook, g: int, profile: str, min_run: float) -> _Plan | None:
    """The fewest jobs to stop on GPU ``g`` so that ``profile`` fits there (at the lowest start
    of those that need the fewest), or None when some start's jobs are not all stoppable."""
    best: _Plan | None = None
    for _, jobs in _way(core, g, profile):
        coming = tuple(j for j in jobs if _on_the_way(book, j))
        victims = tuple(j for j in jobs if j not in coming)
        if not all(_stoppable(book, v, core.now, min_run) for v in victims):
            continue
        if best is None or len(victims) < len(best.victims):
            best = _Plan(g, victims, coming)
    return best


def _elsewhere(core: Core, book: JobBook, drain: Drain, min_run: float, cap: int) -> _Plan | None:
    """The pool's GPU (other than the drained one) where the fewest stoppable jobs, at most
    ``cap``, stand in the profile's way; None when there is none."""
    rec = book.records[drain.job_id]
    pool = core.cluster.gpus[drain.gpu].partition
    led = core.ledger
    best: _Plan | None = None
    for n, g in enumerate(core.cluster.partition_gpus[pool]):
        if n == MAX_SCAN:
            break
        if g == drain.gpu or not led.gpu_usable(g):
            continue
        if not node_admits(led, rec.job, core.cluster.gpus[g].node):
            continue
        plan = _plan_on(core, book, g, drain.profile, min_run)
        if plan is None or not plan.victims or len(plan.victims) > cap:
            continue  # (no victims: it fits beside what runs, placement's business)
        if best is None or len(plan.victims) < len(best.victims):
            best = plan
    return best


def _first_to_age(core: Core, book: JobBook, drain: Drain, min_run: float) -> float | None:
    """When the jobs in the way at some start on the drained GPU are all old enough to be
    stopped, where only their age keeps them from it now; None when nothing ages into it."""
    best: float | None = None
    for _, jobs in _way(core, drain.gpu, drain.profile):
        ages = [_ages_at(book, j, min_run) for j in jobs if not _on_the_way(book, j)]
        if not ages or any(a is None for a in ages):
            continue
        at = max(a for a in ages if a is not None)
        if at > core.now and (best is None or at < best):
            best = at
    return best


def _ages_at(book: JobBook, jid: str, min_run: float) -> float | None:
    """When ``jid`` may be stopped for a defrag by its age; None when it may not be at all."""
    rec = book.records[jid]
    job = rec.job
    if not job.checkpointable or job.workload_class is WorkloadClass.SERVING:
        return None
    if rec.started_at is None or rec.notice is not None or rec.stop_reason is Reason.MIG_DEFRAG:
        return None
    return rec.started_at + min_run
