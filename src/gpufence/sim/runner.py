"""Replay a workload through the scheduler core on a virtual clock and record what happened.

The simulator plays the front end: it turns workload items into events, calls
``Scheduler.step``, and applies the decisions exactly as the control plane would (binds start
work, stops end it, notices are acknowledged after the job's checkpoint time, MIG re-partitions
finish after their delay). No scheduling logic lives here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import (
    Bind,
    Decision,
    MigReconfigure,
    Notice,
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
from gpufence.model.job import Job
from gpufence.model.lifecycle import TERMINAL, JobState, after_stop
from gpufence.sched.scheduler import Scheduler, SchedulerConfig
from gpufence.sim.event_queue import EventQueue
from gpufence.state.invariants import check


@dataclass(frozen=True, slots=True)
class WorkItem:
    """A job of the workload and how it behaves once running."""

    job: Job
    duration_s: float  # run time on its GPUs, uninterrupted
    ack_after_s: float | None = 30.0  # time to checkpoint when noticed; None = never acks
    checkpoint_every_s: float | None = None  # periodic checkpoints bound the work lost
    activity: tuple[tuple[float, float], ...] = ()  # (seconds after start, utilisation)


@dataclass(frozen=True, slots=True)
class At:
    """A cluster event (node failure, repair, ...) injected at a time."""

    time: float
    event: Event


@dataclass(slots=True)
class JobTrace:
    item: WorkItem
    submitted: float
    first_start: float | None = None
    end: float | None = None
    state: JobState = JobState.PENDING
    attempt: int = 0
    started: float | None = None
    done_s: float = 0.0  # work kept (checkpointed) across attempts, in solo seconds
    attempts: int = 0
    speed: float = 1.0  # solo seconds of work per second in the current attempt


@dataclass(slots=True)
class Occupancy:
    """One attempt of a job holding GPUs from ``start`` to ``end``."""

    job_id: str
    gpus: tuple[int, ...]
    exclusive: bool
    start: float
    end: float | None = None


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
    """Run-time stretch of a job bound now (co-location, fabric), 1.0 = solo speed."""

    def factor(self, bind: Bind, sim: Simulation) -> float: ...


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
        tr.state, tr.end, tr.started = JobState.CANCELLED, now, None
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
        jid, attempt = payload[0], payload[1]
        tr = self.jobs[jid]
        if tr.attempt != attempt or tr.started is None:
            return None  # the attempt this was meant for is over
        if kind == "finish":
            tr.state, tr.end, tr.started = JobState.DONE, now, None
            self._close(jid, now)
            return JobFinished(jid)
        if kind == "ack":
            tr.done_s += (now - tr.started) * tr.speed  # the checkpoint keeps all work so far
            tr.started = now
            return CheckpointAck(jid)
        if kind == "ckpt":
            every = tr.item.checkpoint_every_s
            assert every is not None
            self.q.push(now + every / tr.speed, ("ckpt", (jid, attempt)))
            self.checkpoints.append((now, tr.item.job.total_gpus))
            return CheckpointWritten(jid)
        if kind == "activity":
            return Activity(jid, payload[2])
        if kind == "stopped":
            tr.started = None
            self._close(jid, now)
            return JobStopped(jid)
        raise AssertionError(kind)

    def _close(self, job_id: str, now: float) -> None:
        occ = self._open.pop(job_id, None)
        if occ is not None:
            occ.end = now

    def _apply(self, d: Decision, now: float) -> None:
        if isinstance(d, Bind):
            gpus = tuple(g for a in d.assignments for g in a.gpus)
            whole = all(
                a.mig_profile is None and a.milli == 1000 and not a.time_sliced
                for a in d.assignments
            )
            occ = Occupancy(d.job_id, gpus, whole, now)
            self.occupancy.append(occ)
            self._open[d.job_id] = occ
            tr = self.jobs[d.job_id]
            tr.attempt += 1
            tr.attempts += 1
            tr.state = JobState.RUNNING
            tr.started = now
            if tr.first_start is None:
                tr.first_start = now
            left = max(0.0, tr.item.duration_s - tr.done_s)
            tr.speed = 1.0 / self.slowdown.factor(d, self) if self.slowdown is not None else 1.0
            self.q.push(now + left / tr.speed, ("finish", (d.job_id, tr.attempt)))
            for offset, util in tr.item.activity:
                if offset < left:
                    self.q.push(now + offset, ("activity", (d.job_id, tr.attempt, util)))
            every = tr.item.checkpoint_every_s
            if every:  # periodic checkpoints: the scheduler prefers victims that lose least
                self.q.push(now + every / tr.speed, ("ckpt", (d.job_id, tr.attempt)))
        elif isinstance(d, Stop):
            tr = self.jobs[d.job_id]
            if tr.started is not None:
                ran = (now - tr.started) * tr.speed
                every = tr.item.checkpoint_every_s
                tr.done_s += (ran // every) * every if every else 0.0
            # the stop is confirmed at once here: a stop that ends the job ends it now
            tr.state = JobState.STOPPING if d.requeue else after_stop(d.reason, requeue=False)
            if not d.requeue:
                tr.end = now
            self.q.push(now, ("stopped", (d.job_id, tr.attempt)))
        elif isinstance(d, Notice):
            tr = self.jobs[d.job_id]
            if d.reason is not Reason.IDLE and tr.item.ack_after_s is not None:
                self.q.push(now + tr.item.ack_after_s, ("ack", (d.job_id, tr.attempt)))
        elif isinstance(d, Reject):
            tr = self.jobs[d.job_id]
            tr.state, tr.end = JobState.REJECTED, now
        elif isinstance(d, Requeue):
            self.jobs[d.job_id].state = JobState.PENDING
        elif isinstance(d, MigReconfigure):
            self.q.push(now + d.ready_after_s, ("mig", d.gpu))
