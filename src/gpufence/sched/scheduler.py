"""``Scheduler.step(events, now) -> decisions``: the pure, deterministic scheduling core.

The simulator and the control plane both turn what they observe into events and apply the
decisions they get back. Nothing here reads a clock, does I/O or draws unseeded randomness.
A cycle runs: apply events -> expire notices -> warn idle sessions -> place each partition (with
reservations and backfill) -> lend idle capacity -> reclaim lent capacity / protect serving.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import (
    Decision,
    NoticeWithdrawn,
    PendingReason,
    Reason,
    Reject,
    Requeue,
    Stop,
)
from gpufence.model.events import (
    Activity,
    CheckpointAck,
    CheckpointWritten,
    Event,
    JobCancelled,
    JobFinished,
    JobRestored,
    JobStopped,
    JobSubmitted,
    MigReconfigured,
    NodeDown,
    NodeUp,
    Tick,
    UsageRestored,
)
from gpufence.model.job import WorkloadClass
from gpufence.model.lifecycle import after_stop
from gpufence.model.partition import PreemptionMode, SharingMode
from gpufence.sched.context import Context, Counters
from gpufence.sched.fairshare import FairShare, TenantShare
from gpufence.sched.intake import Refused, resolve
from gpufence.sched.jobs import TERMINAL, JobRecord, JobState
from gpufence.sched.passes import CAPACITY, lend_pass, place_partition
from gpufence.sched.placement.dispatch import PlacementEngine
from gpufence.sched.protect import MAX_BATCH, protect_partition
from gpufence.sched.queues import PendingQueues
from gpufence.sched.reclaim import idle_deadline, track, warn_idle
from gpufence.sched.registry import make_scorer
from gpufence.sched.restore import restore
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


class Scheduler:
    def __init__(self, cluster: Cluster, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        scorers = {
            p: make_scorer(part.placement, self.config.seed)
            for p, part in cluster.partitions.items()
            if part.sharing is SharingMode.FRACTIONAL
        }
        self.ctx = Context(
            cluster=cluster,
            ledger=Ledger(cluster),
            queues=PendingQueues(cluster),
            fairshare=FairShare(cluster, self.config.fair_share_half_life_s),
            engine=PlacementEngine(cluster, scorers),
        )
        self._started = False
        # partitions whose lent capacity a partition's jobs may borrow
        self._lenders: dict[str, list[str]] = {
            p: [lp for lp, part in cluster.partitions.items() for r in part.lending if p in r.to]
            for p in cluster.partitions
        }

    # ------------------------------------------------------------------ public API
    @property
    def cluster(self) -> Cluster:
        return self.ctx.cluster

    @property
    def ledger(self) -> Ledger:
        return self.ctx.ledger

    @property
    def counters(self) -> Counters:
        return self.ctx.counters

    @property
    def now(self) -> float:
        return self.ctx.now

    def step(self, events: Iterable[Event], now: float) -> list[Decision]:
        ctx = self.ctx
        if self._started and now < ctx.now:
            raise ValueError(f"time went backwards: step at {now} after {ctx.now}")
        self._started = True
        ctx.fairshare.advance(now, ctx.ledger)
        ctx.now = now
        ctx.decisions = []
        for ev in events:
            self._apply(ev)
        self._expire_notices()
        warn_idle(ctx)
        self._cycle()
        if self.config.validate:
            problems = check(ctx.ledger)
            if problems:
                raise InvariantViolation("; ".join(problems[:10]))
        return ctx.decisions

    def fair_share_usage(self) -> dict[str, float]:
        """Each queue's decayed past usage (milli-GPU-seconds) as of ``now``: what a front end
        saves to hand back with ``UsageRestored`` after a restart."""
        return dict(self.ctx.fairshare.usage)

    def job(self, job_id: str) -> JobRecord:
        return self.ctx.records[job_id]

    def jobs(self) -> dict[str, JobRecord]:
        return self.ctx.records

    def why_pending(self, job_id: str) -> PendingReason | None:
        ctx = self.ctx
        rec = ctx.records.get(job_id)
        if rec is None or rec.state is not JobState.PENDING:
            return None
        return ctx.why(job_id) or PendingReason(Reason.QUEUED, "not yet considered")

    def fair_share(self, partition: str) -> list[TenantShare]:
        return self.ctx.fairshare.explain(partition, self.ctx.ledger)

    def pending_count(self) -> int:
        return len(self.ctx.queues)

    def next_wakeup(self) -> float | None:
        """The earliest time a deadline (notice, idle threshold) falls due, for a front end to
        send a Tick then; None when nothing is timed."""
        ctx = self.ctx
        times = [n.deadline for j in ctx.noticed if (n := ctx.records[j].notice) is not None]
        idle = idle_deadline(ctx)
        if idle is not None:
            times.append(idle)
        times += [t for t in ctx.protect_after.values() if ctx.now < t < INF]
        return min(times) if times else None

    # ------------------------------------------------------------------ events
    def _apply(self, ev: Event) -> None:
        ctx = self.ctx
        if isinstance(ev, JobSubmitted):
            self._submit(ev)
            return
        if isinstance(ev, Tick):
            return
        if isinstance(ev, JobRestored):
            restore(ctx, ev)
            return
        if isinstance(ev, UsageRestored):
            ctx.fairshare.restore(dict(ev.usage), ev.at, ctx.now)
            return
        if isinstance(ev, NodeDown | NodeUp):
            self._node(ev.node, isinstance(ev, NodeUp))
            return
        if isinstance(ev, MigReconfigured):
            layout = ctx.mig_pending.pop(ev.gpu, None)
            if layout is not None:
                ctx.ledger.set_mig_layout(ev.gpu, layout)
                ctx.ledger.set_blocked(ev.gpu, False)
            return
        rec = ctx.records.get(ev.job_id)
        if rec is None or rec.state in TERMINAL:
            return  # late report about a job we no longer track: nothing to do
        if isinstance(ev, JobFinished):
            if rec.state is JobState.PENDING:
                return  # a late report from an earlier attempt: the requeued job lives on
            n = rec.notice
            if not ev.succeeded and n is not None and n.reason is not Reason.IDLE:
                # it was asked to wrap up and went down doing so (e.g. killed by the notice
                # signal before it could handle it): a stop it did itself, so it is requeued
                # like any preempted job instead of failing for the scheduler's own action
                self._stop(rec, n.reason, True, "exited during its notice")
                self._stopped(rec)
                return
            self._end(rec, JobState.DONE if ev.succeeded else JobState.FAILED)
        elif isinstance(ev, JobStopped):
            self._stopped(rec)
        elif isinstance(ev, JobCancelled):
            self._end(rec, JobState.CANCELLED)
        elif isinstance(ev, CheckpointAck):
            rec.last_checkpoint = ctx.now
            if rec.notice is not None and rec.notice.reason is not Reason.IDLE:
                self._stop(rec, rec.notice.reason, True, "checkpoint acknowledged")
        elif isinstance(ev, CheckpointWritten):
            rec.last_checkpoint = ctx.now
        elif isinstance(ev, Activity):
            self._activity(rec, ev.utilization)

    def _submit(self, ev: JobSubmitted) -> None:
        ctx = self.ctx
        job = ev.job
        if job.id in ctx.records:
            ctx.decisions.append(Reject(job.id, Reason.DUPLICATE, f"job id {job.id} already used"))
            ctx.counters.rejects += 1
            return
        got = resolve(ctx.cluster, job)
        if isinstance(got, Refused):
            rec = JobRecord(job, "", "", JobState.REJECTED)
            ctx.records[job.id] = rec
            ctx.decisions.append(Reject(job.id, got.reason, got.message))
            ctx.counters.rejects += 1
            return
        rec = JobRecord(job, got.home, got.queue)
        ctx.records[job.id] = rec
        ctx.queues.add(rec)
        ctx.engine.observe(job, got.home)

    def _release(self, rec: JobRecord) -> None:
        ctx = self.ctx
        jid = rec.job.id
        if jid in ctx.ledger.allocs:
            ctx.ledger.release(jid)
        ctx.noticed.pop(jid, None)
        ctx.interactive.pop(jid, None)
        rec.notice = None

    def _end(self, rec: JobRecord, state: JobState) -> None:
        ctx = self.ctx
        if rec.state is JobState.PENDING:
            ctx.queues.remove(rec.job.id)
            ctx.pending_reason.pop(rec.job.id, None)
            ctx.nominations.pop(rec.job.id, None)
        else:
            self._release(rec)
        rec.state = state

    def _stop(self, rec: JobRecord, reason: Reason, requeue: bool, message: str) -> None:
        ctx = self.ctx
        if rec.notice is not None and rec.notice.counted:
            ctx.counters.gpu_seconds_lost += rec.work_at_risk(ctx.now) * rec.job.total_gpus
        ctx.noticed.pop(rec.job.id, None)
        rec.notice = None
        rec.state = JobState.STOPPING
        rec.stop_reason = reason
        rec.requeue_on_stop = requeue
        ctx.decisions.append(Stop(rec.job.id, reason, requeue, message))

    def _stopped(self, rec: JobRecord) -> None:
        ctx = self.ctx
        if rec.state is JobState.PENDING:
            return
        self._release(rec)
        if rec.requeue_on_stop:
            rec.attempt += 1
            rec.state = JobState.PENDING
            rec.started_at = None
            ctx.queues.add(rec)
            ctx.counters.requeues += 1
            reason = rec.stop_reason or Reason.QUEUED
            ctx.decisions.append(Requeue(rec.job.id, reason, rec.attempt, "back in its queue"))
        else:
            rec.state = after_stop(rec.stop_reason or Reason.QUEUED, requeue=False)

    def _activity(self, rec: JobRecord, utilization: float) -> None:
        ctx = self.ctx
        pol = ctx.cluster.partitions[rec.home].reclaim if rec.home else None
        threshold = pol.idle_threshold if pol is not None else 0.0
        if utilization < threshold:
            return
        rec.last_active = ctx.now
        if rec.notice is not None and rec.notice.reason is Reason.IDLE:
            rec.notice = None
            ctx.noticed.pop(rec.job.id, None)
            ctx.decisions.append(
                NoticeWithdrawn(rec.job.id, Reason.ACTIVE_AGAIN, "session active again")
            )
        if rec.job.id in ctx.interactive:
            track(ctx, rec)

    def _node(self, name: str, up: bool) -> None:
        ctx = self.ctx
        idx = ctx.cluster.node_by_name.get(name)
        if idx is None or ctx.ledger.node_up[idx] == up:
            return
        ctx.ledger.set_node_up(idx, up)
        if up:
            return
        for jid in ctx.ledger.jobs_on_node(idx):
            rec = ctx.records[jid]
            if rec.state is JobState.RUNNING:
                self._stop(rec, Reason.NODE_FAILURE, True, f"node {name} failed")

    def _expire_notices(self) -> None:
        ctx = self.ctx
        for jid in list(ctx.noticed):
            rec = ctx.records[jid]
            n = rec.notice
            if n is None or n.deadline > ctx.now or rec.state is not JobState.RUNNING:
                continue
            if n.reason is Reason.IDLE:
                ctx.counters.reclaims[Reason.IDLE] += 1
                self._stop(rec, Reason.IDLE, False, "idle session reclaimed after its warning")
            else:
                self._stop(rec, n.reason, True, "grace period expired without checkpoint ack")

    # ------------------------------------------------------------------ cycle
    def _hold_for_nominations(self) -> list[int]:
        """While a job waits for its victims to stop, the whole GPUs free in the pools it will
        run in are held for it, so that nothing else (a requeued victim, a borrower) takes what
        the preemption or reclaim freed. The holds last for this cycle's placement only."""
        ctx = self.ctx
        led = ctx.ledger
        held: list[int] = []
        for jid, nom in ctx.nominations.items():
            if not ctx.victims_pending(nom):
                continue
            for pool in nom.pools:
                buckets = led.buckets[pool]
                nodes = [n for k in range(1, len(buckets)) for n in buckets[k]]
                for node in nodes:
                    for g in led.free_gpus(pool, node):
                        led.hold(g, jid)
                        held.append(g)
        return held

    def _dirty(self, p: str) -> bool:
        """Could anything in partition ``p``'s queue fit now that did not last cycle? Only if
        capacity came back to a pool it may use, jobs arrived, its reservation fell due, or a
        waiting job's victims stopped."""
        ctx = self.ctx
        led = ctx.ledger
        pools = [p, *self._lenders[p]]
        seen = (sum(led.freed[q] for q in pools), ctx.queues.added[p])
        res = ctx.reservations.get(p)
        due = res is not None and ctx.now > res.start
        nominated = any(ctx.records[j].home == p for j in ctx.nominations)
        if seen == ctx.seen.get(p) and not due and not nominated:
            return False
        ctx.seen[p] = seen
        return True

    def _cycle(self) -> None:
        ctx = self.ctx
        ctx.cycle += 1
        first = [ctx.records[j].home for j, n in ctx.nominations.items() if n.incident]
        order = list(dict.fromkeys([*first, *ctx.cluster.partitions]))
        held = self._hold_for_nominations() if ctx.nominations else []
        failed = {
            p: place_partition(ctx, p) for p in order if ctx.queues.shapes[p] and self._dirty(p)
        }
        lend_pass(ctx, failed)
        for g in held:
            ctx.ledger.unhold(g)
        for p in ctx.cluster.partitions:
            part = ctx.cluster.partitions[p]
            lent = ctx.ledger.lent[p] > 0
            incident = part.preemption.mode is not PreemptionMode.OFF
            if not (lent or incident) or not ctx.queues.shapes[p]:
                continue
            # after a pass with capacity failures that changed the picture (new waiting jobs,
            # capacity back in its pool or a donor pool, lending), or when protection said it
            # could find more then (a victim ages past its minimum runtime, the window slides)
            donors = (p, *part.preemption.from_partitions)
            state = (
                ctx.queues.added[p],
                sum(ctx.ledger.freed[d] for d in donors),
                ctx.ledger.lent[p],
                len(ctx.noticed),
            )
            due = ctx.now >= ctx.protect_after.get(p, 0.0)
            if not due and (not failed.get(p) or ctx.protect_seen.get(p) == state):
                continue
            ctx.protect_seen[p] = state
            ctx.protect_after[p] = INF
            candidates = (
                r
                for r in ctx.queues.ordered(p, lambda q: ctx.fairshare.share(q, ctx.ledger))
                if (lent or r.job.workload_class is WorkloadClass.SERVING)
                and r.job.id not in ctx.nominations
                and (why := self.why_pending(r.job.id)) is not None
                and (why.reason in CAPACITY or why.reason is Reason.PREEMPTION_BUDGET)
            )
            waiting = list(islice(candidates, MAX_BATCH))
            if waiting:
                protect_partition(ctx, p, waiting)
