"""The property tests' front end: applies the scheduler's decisions the way a real one would
(Bind -> the job runs; Stop -> JobStopped a bit later; Notice -> sometimes CheckpointAck,
sometimes the deadline passes; MigReconfigure -> MigReconfigured after its delay) and mixes in
random finishes, cancellations, node failures, activity samples and ticks."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from hypothesis import strategies as st
from strategies import World, jobs

from gpufence.model.decisions import (
    Bind,
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
    NodeDown,
    NodeUp,
    Tick,
)


@dataclass
class FrontEnd:
    """What the test's front end believes about each job, from the decisions it applied."""

    state: dict[str, str] = field(default_factory=dict)  # pending/running/stopping/ended
    attempt: dict[str, int] = field(default_factory=dict)
    bound: set[tuple[str, int]] = field(default_factory=set)  # (job, attempt) ever bound
    duration: dict[str, float] = field(default_factory=dict)
    requeue: dict[str, bool] = field(default_factory=dict)  # what the last Stop said
    expect_requeue: set[str] = field(default_factory=set)
    # notices the scheduler has open (until Stop / withdrawal / ack / the job's end): a job
    # that fails while a non-idle notice is open counts as stopped and is requeued
    noticed: dict[str, Reason] = field(default_factory=dict)
    self_stopped: set[str] = field(default_factory=set)  # their Stop needs no JobStopped
    ended_now: set[str] = field(default_factory=set)  # ended by an event of this step
    # (time, seq, event, attempt it belongs to or 0): a job's own reports die with its attempt
    timers: list[tuple[float, int, Event, int]] = field(default_factory=list)
    seq: int = 0

    def at(self, t: float, ev: Event, attempt: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.timers, (t, self.seq, ev, attempt))

    def due(self, now: float) -> list[Event]:
        out: list[Event] = []
        gone: set[str] = set()  # jobs whose processes this batch already reports as gone
        while self.timers and self.timers[0][0] <= now:
            _, _, ev, attempt = heapq.heappop(self.timers)
            if attempt:  # a finish report: only while that attempt still holds its GPUs
                jid = ev.job_id  # type: ignore[union-attr]
                live = self.state[jid] in ("running", "stopping") and jid not in gone
                if self.attempt[jid] != attempt or not live:
                    continue
            if isinstance(ev, JobStopped | JobFinished):
                gone.add(ev.job_id)
            out.append(ev)
        return out

    def observe(self, events: list[Event]) -> None:
        """What the front end knows will happen to its own jobs when these events apply."""
        self.ended_now = set()
        before = dict(self.state)
        for ev in events:
            jid = getattr(ev, "job_id", "")
            open_notice = self.noticed.get(jid)
            if isinstance(ev, CheckpointAck) and open_notice not in (None, Reason.IDLE):
                del self.noticed[jid]  # the scheduler stops it now
                continue
            if (
                isinstance(ev, JobFinished)
                and not ev.succeeded
                and self.state.get(jid) == "running"
                and open_notice not in (None, Reason.IDLE)
            ):
                del self.noticed[jid]
                self.self_stopped.add(jid)
                if open_notice is Reason.TIME_LIMIT:  # a time limit ends the job regardless
                    self.state[jid] = "ended"
                    continue
                self.state[jid] = "pending"
                self.expect_requeue.add(jid)
                continue
            if isinstance(ev, JobStopped | JobFinished | JobCancelled):
                self.noticed.pop(jid, None)
            if isinstance(ev, JobStopped) and self.state.get(ev.job_id) == "stopping":
                if self.requeue[ev.job_id]:
                    self.state[ev.job_id] = "pending"
                    self.expect_requeue.add(ev.job_id)
                else:
                    self.state[ev.job_id] = "ended"
            elif (
                isinstance(ev, JobFinished)
                and self.state.get(ev.job_id)
                in (
                    "running",
                    "stopping",
                )
            ) or (
                isinstance(ev, JobCancelled)
                and self.state.get(ev.job_id)
                in (
                    "pending",
                    "running",
                    "stopping",
                )
            ):
                self.state[ev.job_id] = "ended"
        self.ended_now = {j for j, s in self.state.items() if s == "ended" and before.get(j) != s}

    def live(self, jid: str, want: str) -> bool:
        """The job is in ``want`` state, or was until an event later in this step ended it
        (the scheduler applies events in order, so it may have acted on it before the end)."""
        return self.state.get(jid) == want or jid in self.ended_now

    def running(self) -> list[str]:
        return sorted(j for j, s in self.state.items() if s == "running")


def check_decision(d: Decision) -> None:
    assert isinstance(d.reason, Reason), d
    if isinstance(d, Reject | Notice | Stop):
        assert d.message, f"{type(d).__name__} without a message: {d}"


def apply_decisions(
    fe: FrontEnd, decisions: list[Decision], now: float, data: st.DataObject
) -> None:
    for d in decisions:
        check_decision(d)
        if isinstance(d, Bind):
            jid = d.job_id
            assert fe.state.get(jid) == "pending", f"bound while {fe.state.get(jid)}: {d}"
            key = (jid, fe.attempt[jid])
            assert key not in fe.bound, f"bound twice in attempt {key[1]}: {d}"
            fe.bound.add(key)
            fe.noticed.pop(jid, None)
            fe.state[jid] = "running"
            dur = fe.duration[jid]
            if dur != float("inf"):
                ok = data.draw(st.booleans(), label="ok")
                fe.at(now + dur, JobFinished(jid, ok), fe.attempt[jid])
        elif isinstance(d, Stop):
            fe.noticed.pop(d.job_id, None)
            if d.job_id in fe.self_stopped:  # it already exited during its notice
                fe.self_stopped.discard(d.job_id)
                continue
            assert fe.live(d.job_id, "running"), f"stop while {fe.state.get(d.job_id)}"
            if d.job_id in fe.ended_now:
                continue
            fe.state[d.job_id] = "stopping"
            fe.requeue[d.job_id] = d.requeue
            delay = data.draw(st.sampled_from((0.0, 0.0, 3.0, 50.0)), label="stop delay")
            fe.at(now + delay, JobStopped(d.job_id))
        elif isinstance(d, Notice):
            assert fe.state.get(d.job_id) == "running", f"notice while {fe.state.get(d.job_id)}"
            assert d.deadline >= now
            fe.noticed[d.job_id] = d.reason
            choice = data.draw(st.integers(0, 3), label="notice answer")
            if choice == 0:
                fe.at(now + data.draw(st.sampled_from((0.0, 1.0, 10.0))), CheckpointAck(d.job_id))
            elif choice == 1 and d.reason is Reason.IDLE:
                fe.at(now + 1.0, Activity(d.job_id, 0.9))
            # otherwise: let the deadline pass
        elif isinstance(d, NoticeWithdrawn):
            assert fe.live(d.job_id, "running"), d
            fe.noticed.pop(d.job_id, None)
        elif isinstance(d, Requeue):
            assert d.job_id in fe.expect_requeue, f"unexpected requeue: {d}"
            fe.expect_requeue.discard(d.job_id)
            assert d.attempt == fe.attempt[d.job_id] + 1, d
            fe.attempt[d.job_id] = d.attempt
        elif isinstance(d, Reject):
            if d.reason is not Reason.DUPLICATE:
                assert fe.live(d.job_id, "pending"), d
                fe.state[d.job_id] = "ended"
        elif isinstance(d, MigReconfigure):
            assert d.ready_after_s >= 0
            fe.at(now + d.ready_after_s, MigReconfigured(d.gpu))


def random_events(
    data: st.DataObject, world: World, fe: FrontEnd, now: float, counter: list[int]
) -> list[Event]:
    out: list[Event] = []
    n = data.draw(st.integers(0, 6), label="n events")
    for _ in range(n):
        kind = data.draw(st.integers(0, 11), label="event kind")
        running = fe.running()
        known = sorted(fe.state)
        if kind <= 3:
            counter[0] += 1
            jid = f"j{counter[0]}"
            if known and data.draw(st.integers(0, 30)) == 30:
                jid = data.draw(st.sampled_from(known))  # duplicate id
            job, dur = data.draw(jobs(world, jid, now), label="job")
            if jid not in fe.state:
                fe.state[jid] = "pending"
                fe.attempt[jid] = 1
                fe.duration[jid] = dur
            out.append(JobSubmitted(job))
        elif kind == 4 and running:
            jid = data.draw(st.sampled_from(running))
            out.append(JobFinished(jid, data.draw(st.booleans())))
        elif kind == 5 and known:
            out.append(JobCancelled(data.draw(st.sampled_from(known))))
        elif kind == 6:
            out.append(NodeDown(data.draw(st.sampled_from(world.node_names))))
        elif kind == 7:
            out.append(NodeUp(data.draw(st.sampled_from(world.node_names))))
        elif kind == 8 and running:
            util = data.draw(st.sampled_from((0.0, 0.01, 0.5, 1.0)))
            out.append(Activity(data.draw(st.sampled_from(running)), util))
        elif kind == 9 and running:
            out.append(CheckpointWritten(data.draw(st.sampled_from(running))))
        elif kind == 10:
            # late or stray reports: unknown ids, jobs already ended, acks nobody asked for
            ended = [j for j in known if fe.state[j] == "ended"]
            ghost = data.draw(st.sampled_from(("ghost", *ended[:3])))
            ev = data.draw(
                st.sampled_from(
                    (JobFinished(ghost), JobStopped(ghost), CheckpointAck(ghost), Tick())
                )
            )
            out.append(ev)
            if running and data.draw(st.booleans()):
                out.append(CheckpointAck(data.draw(st.sampled_from(running))))
        elif kind == 11:
            gpu = data.draw(st.integers(0, len(world.cluster.gpus) - 1))
            out.append(MigReconfigured(gpu))  # spurious report: must be ignored
    return out
