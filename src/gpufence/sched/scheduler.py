"""``Scheduler.step(events, now) -> decisions``: the pure, deterministic scheduling core.

The simulator and the control plane both turn what they observe into events and apply the
decisions they get back. Nothing here reads a clock, does I/O or draws unseeded randomness.
The cycle itself, phase by phase, is ``sched/cycle.py``; this module builds the state it runs
on and answers the front ends' questions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Decision, PendingReason, Reason
from gpufence.model.events import Event
from gpufence.sched.book import Counters, JobBook
from gpufence.sched.context import Claims, Core
from gpufence.sched.cycle import SchedulerState, run_cycle
from gpufence.sched.fairshare import FairShare, TenantShare
from gpufence.sched.jobs import JobRecord, JobState
from gpufence.sched.migdyn import MigWork
from gpufence.sched.place import PlaceMemo
from gpufence.sched.placement.dispatch import PlacementEngine
from gpufence.sched.protect import ProtectionState
from gpufence.sched.query import SchedulerQuery
from gpufence.sched.queues import PendingQueues
from gpufence.sched.reasons import PendingReasons
from gpufence.sched.reclaim import idle_deadline
from gpufence.sched.registry import (
    admission_rules,
    make_placer,
    make_queue_order,
    make_reservations,
)
from gpufence.state.closures import NodeClosures
from gpufence.state.invariants import check
from gpufence.state.ledger import Ledger

INF = float("inf")


class InvariantViolation(AssertionError):
    """The ledger broke an invariant (only raised with validation on)."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    fair_share_half_life_s: float = 86400.0
    seed: int = 0  # for the `random` placement policy; nothing else draws randomness
    validate: bool = False  # check every invariant after every step (tests, debugging)
    # the tenants a queue's ``tenant`` label may name (the control plane's tenants): a queue
    # labelled with anything else is nobody's, so any job naming no queue may go there. None
    # (the simulator): every label is a tenant
    tenants: frozenset[str] | None = None


class Scheduler:
    def __init__(self, cluster: Cluster, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        # the core's own queue table: run-time weight and quota changes (``QueueRetuned``,
        # sched/retune.py) change it in place, never the spec the caller holds
        cluster = replace(cluster, queues=dict(cluster.queues))
        parts = cluster.partitions
        seed = self.config.seed
        core = Core(
            cluster=cluster,
            ledger=Ledger(cluster),
            queues=PendingQueues(
                cluster, {p: make_queue_order(part.queue_order) for p, part in parts.items()}
            ),
            fairshare=FairShare(cluster, self.config.fair_share_half_life_s),
            engine=PlacementEngine({p: make_placer(part, seed) for p, part in parts.items()}),
            closures=NodeClosures(cluster),
            reservations=make_reservations(),
            admission=admission_rules(),
            tenants=self.config.tenants,
        )
        core.engine.closures = core.closures
        self.state = SchedulerState(
            core=core,
            book=JobBook(cluster),
            claims=Claims(),
            reasons=PendingReasons(),
            mig=MigWork(),
            protection=ProtectionState(),
            memo=PlaceMemo(cluster),
        )
        self.query = SchedulerQuery(self.state)  # read-only answers for front ends
        self._started = False

    # ------------------------------------------------------------------ public API
    @property
    def cluster(self) -> Cluster:
        return self.state.core.cluster

    @property
    def ledger(self) -> Ledger:
        return self.state.core.ledger

    @property
    def closures(self) -> NodeClosures:
        """Drained nodes and maintenance windows (read them; change them with events)."""
        return self.state.core.closures

    @property
    def counters(self) -> Counters:
        return self.state.book.counters

    @property
    def now(self) -> float:
        return self.state.core.now

    def step(self, events: Iterable[Event], now: float) -> list[Decision]:
        if self._started and now < self.state.core.now:
            raise ValueError(f"time went backwards: step at {now} after {self.state.core.now}")
        self._started = True
        decisions = run_cycle(self.state, events, now)
        if self.config.validate:
            problems = check(self.state.core.ledger, self.state.core.over_quota)
            if problems:
                raise InvariantViolation("; ".join(problems[:10]))
        return decisions

    def decisions_so_far(self) -> list[Decision]:
        """The decisions of the last step -- or, when it raised, those it made before (the
        ledger already reflects them): what a front end applies when a step fails."""
        return list(self.state.made)

    def fair_share_usage(self) -> dict[str, float]:
        """Each queue's decayed past usage (milli-GPU-seconds) as of ``now``: what a front end
        saves to hand back with ``UsageRestored`` after a restart."""
        return dict(self.state.core.fairshare.usage)

    def job(self, job_id: str) -> JobRecord:
        return self.state.book.records[job_id]

    def jobs(self) -> dict[str, JobRecord]:
        return self.state.book.records

    def why_pending(self, job_id: str) -> PendingReason | None:
        s = self.state
        rec = s.book.records.get(job_id)
        if rec is None or rec.state is not JobState.PENDING:
            return None
        gated = s.gates.why(job_id)  # gates: held / dependency / array-limit
        if gated is not None:
            return gated
        why = s.reasons.why(job_id, s.core.queues)
        return why or PendingReason(Reason.QUEUED, "not yet considered")

    def waiting_on(self, job_id: str) -> dict[str, float | None]:
        """The victims a pending job waits for (noticed or told to stop so that it can run),
        each with its notice deadline (None once it was told to stop): what a front end
        needs to say "waiting for j to checkpoint, deadline in 42 s"."""
        nom = self.state.claims.nominations.get(job_id)
        book = self.state.book
        out: dict[str, float | None] = {}
        for v in nom.victims if nom is not None else ():
            if v in book.noticed or v in book.stopping:
                n = book.records[v].notice
                out[v] = n.deadline if n is not None else None
        return out

    def recut_waiters(self, gpu: int) -> tuple[str, ...]:
        """The jobs that wait for the MIG re-cut in flight on ``gpu``, the one it was made
        for first (none when no re-cut is in flight there)."""
        mig = self.state.mig
        if gpu not in mig.pending:
            return ()
        first = mig.made_for.get(gpu)
        rest = sorted(j for j in mig.waiting.get(gpu, {}) if j != first)
        return (first, *rest) if first is not None else tuple(rest)

    def fair_share(self, partition: str) -> list[TenantShare]:
        return self.state.core.fairshare.explain(partition, self.state.core.ledger)

    def pending_count(self) -> int:
        return len(self.state.core.queues)

    def next_wakeup(self) -> float | None:
        """The earliest time a deadline (notice, idle threshold, time limit, protection's next
        look, a maintenance window's start or end) falls due, for a front end to send a Tick
        then; None when nothing is timed."""
        s = self.state
        book = s.book
        times = [n.deadline for j in book.noticed if (n := book.records[j].notice) is not None]
        edge = s.core.closures.next_edge()  # a maintenance window begins or ends
        for due in (idle_deadline(s.core.cluster, book), book.next_limit(), edge):
            if due is not None:
                times.append(due)
        now = s.core.now
        times += [t for t in s.protection.after.values() if now < t < INF]
        if (defrag := s.mig.defrag.next_wakeup(now)) is not None:  # sched/migdefrag_stop.py
            times.append(defrag)
        return min(times) if times else None
