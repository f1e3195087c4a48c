"""Replay a workload through the scheduler core on a virtual clock and record what happened.

The simulator plays the front end: it turns workload items into events, calls
``Scheduler.step``, and applies the decisions exactly as the control plane would (binds start
work, stops end it, notices are acknowledged after the job's checkpoint time, MIG re-partitions
finish after their delay). No scheduling logic lives here.

Progress: a running attempt advances at ``speed`` solo-seconds of work per second. After every
step the slowdown model (``sim.contention``) re-rates the jobs whose neighbours or links
changed; the runner banks the work done at the old speed and re-schedules the attempt's
completion and next periodic checkpoint at the new one (events of an older rating are dropped).
Work lost when an attempt is stopped (the wall time since its last checkpoint, x its GPUs) is
recorded per stop reason: preemptions, reclaims and node failures alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, assert_never

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import (
    Bind,
    Cancel,
    Decision,
    MigReconfigure,
    Notice,
    NoticeWithdrawn,
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
    JobStopped,
    JobSubmitted,
    MigReconfigured,
    Tick,
)
from gpufence.model.lifecycle import TERMINAL, JobState, after_stop, check_move
from gpufence.sched.scheduler import Scheduler, SchedulerConfig
from gpufence.sim.contention import Released
from gpufence.sim.event_queue import EventQueue
from gpufence.sim.workloads.records import At, CommSpec, WorkItem
from gpufence.state.invariants import check
from gpufence.state.ledger import Ledger
from gpufence.telemetry.incidents import counts_as_loss


@dataclass(slots=True)
class JobTrace:
    item: WorkItem
    submitted: float
    first_start: float | None = None
    end: float | None = None
    state: JobState = JobState.PENDING
    attempt: int = 0
    started: float | None = None  # start of the current attempt
    done_s: float = 0.0  # work kept (checkpointed) across attempts, in solo seconds
    attempts: int = 0
    speed: float = 1.0  # solo seconds of work per second, current rating
    ran_s: float = 0.0  # work of this attempt up to ``rated_at``, in solo seconds
    rated_at: float = 0.0
    epoch: int = 0  # bumped at every re-rating: finish/ckpt events carry it
    last_ckpt: float = 0.0  # wall time of the attempt's last checkpoint (or its start)

    def move_to(self, new: JobState) -> None:
        """The one way the simulator changes a job's state: along the lifecycle table
        (``lifecycle.IllegalTransition`` otherwise)."""
        check_move(self.item.job.id, self.state, new)
        self.state = new

    def progress(self, now: float) -> float:
        """Solo seconds of work done in the current attempt by ``now``."""
        return self.ran_s + (now - self.rated_at) * self.speed


@dataclass(slots=True)
class Occupancy:
    """One attempt of a job holding GPUs from ``start`` to ``end``."""

    job_id: str
    gpus: tuple[int, ...]
    exclusive: bool
    start: float
    end: float | None = None
    time_sliced: bool = False


@dataclass
class SimResult:
    jobs: dict[str, JobTrace]
    occupancy: list[Occupancy]
    checkpoints: list[tuple[float, int]]
    log: list[tuple[float, Decision]]
    end_time: float
    steps: int
    invariant_violations: int
    gpu_seconds_allocated: float
    events: int
    counters: dict[str, object] = field(default_factory=dict)
    lost_gpu_s: list[tuple[str, float]] = field(default_factory=list)  # (stop reason, GPU-s)
    rerates: int = 0  # slowdown changes of running jobs (completion re-scheduled)


_Item = tuple[str, object]


class Controller(Protocol):
    """Something in the simulated world that acts on its own schedule (an autoscaler, a metrics
    sampler, a failure injector). ``wake`` returns events for the scheduler and its next time."""

    def first_wake(self) -> float | None: ...

    def wake(self, now: float, sim: Simulation) -> tuple[list[Event], float | None]: ...


class Observer(Protocol):
    """Sees every step's decisions after the simulator applied them."""

    def observe(self, now: float, decisions: list[Decision], sim: Simulation) -> None: ...


class Slowdown(Protocol):
    """Run-time stretch of running jobs (co-location, fabric), 1.0 = solo speed, kept current:
    after each step, given the jobs that started and those that left their GPUs, it returns
    the slowdown of every running job that may have changed (the started ones always)."""

    def update(
        self,
        ledger: Ledger,
        bound: Sequence[str],
        released: Iterable[Released],
        comm: dict[str, CommSpec],
    ) -> dict[str, float]: ...


class Simulation:
    def __init__(
        self,
        cluster: Cluster,
        work: Iterable[WorkItem],
        events: Iterable[At] = (),
        config: SchedulerConfig | None = None,
        check_invariants: bool = True,
        controllers: Iterable[Controller] = (),
        observers: Iterable[Observer] = (),
        slowdown: Slowdown | None = None,
    ) -> None:
        self.cluster = cluster
        self.scheduler = Scheduler(cluster, config)
        self.q: EventQueue[_Item] = EventQueue()
        self.jobs: dict[str, JobTrace] = {}
        self.log: list[tuple[float, Decision]] = []
        self.occupancy: list[Occupancy] = []
        self.checkpoints: list[tuple[float, int]] = []  # (time, GPUs of the job) per write
        self._open: dict[str, Occupancy] = {}
        self._bound: list[str] = []  # this step
        self._released: list[Released] = []
        self.lost_gpu_s: list[tuple[str, float]] = []
        self.rerates = 0
        self.check_invariants = check_invariants
        self.violations = 0
        self._alloc_gpu_s = 0.0
        self._last_t = 0.0
        self._tick_at: float | None = None
        self.events_processed = 0
        for item in work:
            self.q.push(item.job.submit_time, ("submit", item))
        for at in events:
            self.q.push(at.time, ("event", at.event))
        self.controllers = list(controllers)
        self.observers = list(observers)
        self.slowdown = slowdown
        for i, ctl in enumerate(self.controllers):
            first = ctl.first_wake()
            if first is not None:
                self.q.push(first, ("ctl", i))

    def submit(self, item: WorkItem, now: float) -> JobSubmitted:
        """For controllers: register a job created during the run and return its event."""
        self.jobs[item.job.id] = JobTrace(item, submitted=now)
        return JobSubmitted(item.job)

    def cancel(self, job_id: str, now: float) -> JobCancelled | None:
        """For controllers: the front end cancels a job (stopping it if it runs)."""
        tr = self.jobs.get(job_id)
        if tr is None or tr.state in TERMINAL:
            return None
        tr.move_to(JobState.CANCELLED)
        tr.end, tr.started = now, None
        tr.attempt += 1  # invalidates the pending finish of the running attempt
        self._close(job_id, now)
        return JobCancelled(job_id)

    def run(
        self, until: float | None = None, progress: Callable[[float], None] | None = None
    ) -> SimResult:
        steps = 0
        while len(self.q):
            t = self.q.peek_time()
            assert t is not None
            if until is not None and t > until:
                break
            now, due = self.q.pop_due()
            self.events_processed += len(due)
            self._integrate(now)
            events: list[Event] = []
            for item in due:
                if item[0] == "ctl":
                    assert isinstance(item[1], int)
                    more, nxt = self.controllers[item[1]].wake(now, self)
                    events += more
                    if nxt is not None:
                        self.q.push(max(nxt, now), item)
                elif (e := self._to_event(item, now)) is not None:
                    events.append(e)
            decisions = self.scheduler.step(events, now)
            steps += 1
            for d in decisions:
                self.log.append((now, d))
                self._apply(d, now)
            self._rerate(now)
            for obs in self.observers:
                obs.observe(now, decisions, self)
            if self.check_invariants:
                self.violations += len(check(self.scheduler.ledger))
            wake = self.scheduler.next_wakeup()
            if wake is not None and wake > now and (self._tick_at is None or wake < self._tick_at):
                self._tick_at = wake
                self.q.push(wake, ("tick", None))
            if progress is not None:
                progress(now)
        c = self.scheduler.counters
        return SimResult(
            jobs=self.jobs,
            occupancy=self.occupancy,
            checkpoints=self.checkpoints,
            log=self.log,
            end_time=self.q.now,
            steps=steps,
            invariant_violations=self.violations,
            gpu_seconds_allocated=self._alloc_gpu_s,
            events=self.events_processed,
            lost_gpu_s=self.lost_gpu_s,
            rerates=self.rerates,
            counters={
                "binds": c.binds,
                "rejects": c.rejects,
                "requeues": c.requeues,
                "preemptions": dict(c.preemptions),
                "reclaims": dict(c.reclaims),
                "gpu_seconds_lost": c.gpu_seconds_lost,
            },
        )

    # ------------------------------------------------------------------ internals
    def _integrate(self, now: float) -> None:
        held = sum(self.scheduler.ledger.pool_used.values()) / 1000.0
        self._alloc_gpu_s += held * (now - self._last_t)
        self._last_t = now

    def _to_event(self, item: _Item, now: float) -> Event | None:
        kind, payload = item
        if kind == "submit":
            assert isinstance(payload, WorkItem)
            self.jobs[payload.job.id] = JobTrace(payload, submitted=now)
            return JobSubmitted(payload.job)
        if kind == "event":
            assert not isinstance(payload, tuple | WorkItem | None)
            return payload  # type: ignore[return-value]
        if kind == "tick":
            if self._tick_at is not None and self._tick_at <= now:
                self._tick_at = None
            return Tick()
        if kind == "mig":
            assert isinstance(payload, int)
            return MigReconfigured(payload)
        assert isinstance(payload, tuple)
        return self._attempt_event(kind, payload, now)

    def _attempt_event(self, kind: str, payload: tuple[object, ...], now: float) -> Event | None:
        """The event of a timer set for one attempt of a job; None when it no longer applies."""
        jid, attempt = payload[0], payload[1]
        assert isinstance(jid, str)
        tr = self.jobs[jid]
        if tr.attempt != attempt or tr.started is None:
            return None  # the attempt this was meant for is over
        if kind in ("finish", "ckpt") and payload[2] != tr.epoch:
            return None  # scheduled under an older rating of the attempt
        if kind == "finish":
            return self._finished(tr, jid, now)
        if kind == "ack":
            return self._acked(tr, jid, now)
        if kind == "ckpt":
            return self._checkpointed(tr, jid, now)
        if kind == "activity":
            return Activity(jid, payload[2])  # type: ignore[arg-type]
        if kind == "stopped":
            tr.started = None
            self._close(jid, now)
            return JobStopped(jid)
        raise AssertionError(kind)

    def _finished(self, tr: JobTrace, jid: str, now: float) -> Event:
        tr.move_to(JobState.DONE)
        tr.end, tr.started = now, None
        self._close(jid, now)
        return JobFinished(jid)

    def _acked(self, tr: JobTrace, jid: str, now: float) -> Event:
        # the checkpoint keeps all work so far; periodic ones restart
        tr.done_s += tr.progress(now)
        tr.ran_s, tr.rated_at, tr.last_ckpt = 0.0, now, now
        self._schedule(tr, jid, now)
        return CheckpointAck(jid)

    def _checkpointed(self, tr: JobTrace, jid: str, now: float) -> Event:
        tr.last_ckpt = now
        if self.slowdown is None:  # constant speed: every ``every`` solo seconds
            every = tr.item.checkpoint_every_s
            assert every is not None
            self.q.push(now + every / tr.speed, ("ckpt", (jid, tr.attempt, tr.epoch)))
        else:
            self._push_ckpt(tr, jid, now)
        self.checkpoints.append((now, tr.item.job.total_gpus))
        return CheckpointWritten(jid)

    def _close(self, job_id: str, now: float) -> None:
        occ = self._open.pop(job_id, None)
        if occ is not None:
            occ.end = now
            self._released.append(Released(job_id, occ.gpus, occ.time_sliced))

    def _schedule(self, tr: JobTrace, job_id: str, now: float, finish: bool = True) -> None:
        """(Re-)schedule the attempt's completion and next periodic checkpoint at its speed."""
        if finish:
            self._push_finish(tr, job_id, now)
        self._push_ckpt(tr, job_id, now)

    def _push_finish(self, tr: JobTrace, job_id: str, now: float) -> None:
        tr.epoch += 1
        left = max(0.0, tr.item.duration_s - tr.done_s - tr.ran_s)
        self.q.push(now + left / tr.speed, ("finish", (job_id, tr.attempt, tr.epoch)))

    def _push_ckpt(self, tr: JobTrace, job_id: str, now: float) -> None:
        every = tr.item.checkpoint_every_s
        if every:  # periodic checkpoints: the scheduler prefers victims that lose least
            done = tr.progress(now)
            nxt = (math.floor(done / every + 1e-6) + 1) * every  # the next multiple, past done
            self.q.push(now + (nxt - done) / tr.speed, ("ckpt", (job_id, tr.attempt, tr.epoch)))

    def _rerate(self, now: float) -> None:
        """Give the jobs bound this step their speed, and re-rate the running jobs whose
        slowdown changed (their neighbours or their links' load did)."""
        bound, released = self._bound, self._released
        self._bound, self._released = [], []
        if self.slowdown is None or (not bound and not released):
            return
        comm = {j: c for j in bound if (c := self.jobs[j].item.comm) is not None}
        factors = self.slowdown.update(self.scheduler.ledger, bound, released, comm)
        for j in bound:
            factors.setdefault(j, 1.0)
        fresh = set(bound)
        for jid, f in factors.items():
            tr = self.jobs.get(jid)
            if tr is None or tr.started is None or tr.state is not JobState.RUNNING:
                continue
            speed = 1.0 / max(f, 1e-9)
            if jid in fresh:
                tr.speed = speed
                self._schedule(tr, jid, now)
            elif abs(speed - tr.speed) > 1e-9 * tr.speed:
                tr.ran_s = tr.progress(now)
                tr.rated_at, tr.speed = now, speed
                self.rerates += 1
                self._schedule(tr, jid, now)

    def _apply(self, d: Decision, now: float) -> None:
        """Carry out one decision as the control plane would: one case per decision type, and
        ``assert_never`` makes mypy fail here when ``Decision`` gains a type no case handles."""
        match d:
            case Bind():
                self._bind(d, now)
            case Stop():
                self._stop(d, now)
            case Notice():
                tr = self.jobs[d.job_id]
                if d.reason is not Reason.IDLE and tr.item.ack_after_s is not None:
                    self.q.push(now + tr.item.ack_after_s, ("ack", (d.job_id, tr.attempt)))
            case NoticeWithdrawn():
                # nothing to undo: the checkpoint the notice started still finishes, and the
                # core takes an ack it no longer waits for as a plain checkpoint
                pass
            case Reject():
                self._end(d.job_id, JobState.REJECTED, now)
            case Cancel():  # a dependency that can never be met (traces have none)
                self._end(d.job_id, JobState.CANCELLED, now)
            case Requeue():
                self.jobs[d.job_id].move_to(JobState.PENDING)
            case MigReconfigure():
                self.q.push(now + d.ready_after_s, ("mig", d.gpu))
            case _:
                assert_never(d)

    def _end(self, job_id: str, state: JobState, now: float) -> None:
        """A pending job the scheduler ended (rejected, cancelled): it never ran."""
        tr = self.jobs[job_id]
        tr.move_to(state)
        tr.end = now

    def _bind(self, d: Bind, now: float) -> None:
        gpus = tuple(g for a in d.assignments for g in a.gpus)
        whole = all(
            a.mig_profile is None and a.milli == 1000 and not a.time_sliced for a in d.assignments
        )
        sliced = any(a.time_sliced for a in d.assignments)
        occ = Occupancy(d.job_id, gpus, whole, now, time_sliced=sliced)
        self.occupancy.append(occ)
        self._open[d.job_id] = occ
        tr = self.jobs[d.job_id]
        tr.attempt += 1
        tr.attempts += 1
        tr.move_to(JobState.RUNNING)
        tr.started = now
        if tr.first_start is None:
            tr.first_start = now
        tr.ran_s, tr.rated_at, tr.last_ckpt, tr.speed = 0.0, now, now, 1.0
        left = max(0.0, tr.item.duration_s - tr.done_s)
        if self.slowdown is None:  # solo speed for good: schedule now
            self._push_finish(tr, d.job_id, now)
        for offset, util in tr.item.activity:
            if offset < left:
                self.q.push(now + offset, ("activity", (d.job_id, tr.attempt, util)))
        if self.slowdown is None:
            self._push_ckpt(tr, d.job_id, now)
        else:
            self._bound.append(d.job_id)  # speed and completion: after the step (_rerate)

    def _stop(self, d: Stop, now: float) -> None:
        tr = self.jobs[d.job_id]
        if tr.started is not None:
            every = tr.item.checkpoint_every_s
            tr.done_s += (tr.progress(now) // every) * every if every else 0.0
            if counts_as_loss(str(tr.item.job.workload_class), str(d.reason)):
                lost = (now - tr.last_ckpt) * tr.item.job.total_gpus
                self.lost_gpu_s.append((str(d.reason), lost))
        # the stop is confirmed at once here: a stop that ends the job ends it now (through
        # ``stopping``, as in the core and the control plane)
        tr.move_to(JobState.STOPPING)
        if not d.requeue:
            tr.move_to(after_stop(d.reason, requeue=False))
            tr.end = now
        self.q.push(now, ("stopped", (d.job_id, tr.attempt)))
