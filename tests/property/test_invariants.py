"""Property tests: random clusters, job streams and event sequences, with validation on.

A small simulated front end applies the decisions (Bind -> the job runs; Stop -> JobStopped a bit
later; Notice -> sometimes CheckpointAck, sometimes the deadline passes; MigReconfigure ->
MigReconfigured after its delay) and mixes in random finishes, cancellations, node failures,
activity samples and ticks. After every step it checks what the scheduler promised.
"""

from __future__ import annotations

import os

import pytest
from frontend import FrontEnd, apply_decisions, random_events
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from strategies import World, worlds

from gpufence.model.decisions import (
    Bind,
    Decision,
    MigReconfigure,
    Reason,
    Reject,
    Requeue,
    Stop,
)
from gpufence.model.events import (
    Event,
    JobCancelled,
    JobFinished,
    JobStopped,
    JobSubmitted,
    NodeDown,
    NodeUp,
)
from gpufence.sched.jobs import TERMINAL, JobState
from gpufence.sched.scheduler import Scheduler, SchedulerConfig

# GPUFENCE_NO_SHRINK=1 reports the first failure as found (faster when debugging).
if os.environ.get("GPUFENCE_NO_SHRINK"):
    settings.register_profile("noshrink", phases=[Phase.explicit, Phase.reuse, Phase.generate])
    settings.load_profile("noshrink")

SCALE = float(os.environ.get("GPUFENCE_PROP_SCALE", "1"))  # more examples when bug-hunting
TRACE = bool(os.environ.get("GPUFENCE_TRACE"))
DTS = (0.0, 0.0, 1.0, 5.0, 30.0, 60.0, 130.0, 700.0, 2000.0)


def check_books(sched: Scheduler, fe: FrontEnd) -> None:
    """Every submitted job is in exactly one place, and it matches what the front end saw."""
    recs = sched.jobs()
    assert set(recs) == set(fe.state)
    pending = {j for j, r in recs.items() if r.state is JobState.PENDING}
    holding = {j for j, r in recs.items() if r.state in (JobState.RUNNING, JobState.STOPPING)}
    terminal = {j for j, r in recs.items() if r.state in TERMINAL}
    assert len(pending) + len(holding) + len(terminal) == len(recs)
    assert {j.job_id for j in sched.query.pending()} == pending
    assert set(sched.ledger.allocs) == holding
    for j, r in recs.items():
        fs = fe.state[j]
        if r.state is JobState.PENDING:
            assert fs == "pending", (j, fs, r.state)
            why = sched.why_pending(j)
            assert why is not None, j
            # after a cycle every waiting job has been considered and has a real reason
            assert why.reason is not Reason.QUEUED and why.message, (j, why)
        elif r.state is JobState.RUNNING:
            assert fs == "running", (j, fs, r.state)
        elif r.state is JobState.STOPPING:
            assert fs == "stopping", (j, fs, r.state)
        else:
            assert fs == "ended", (j, fs, r.state)
            assert sched.why_pending(j) is None


PROGRESS_EVENTS = (JobSubmitted, JobFinished, JobCancelled, JobStopped, NodeDown, NodeUp)
PROGRESS_DECISIONS = (Bind, Stop, Requeue, Reject)


def check_mig_progress(churn: dict[int, int], events: list[Event], ds: list[Decision]) -> None:
    """No MIG re-partition churn: while nothing else changes (no job starts, stops, arrives or
    leaves, no node changes), a GPU is re-partitioned at most twice — not back and forth."""
    if any(isinstance(e, PROGRESS_EVENTS) for e in events) or any(
        isinstance(d, PROGRESS_DECISIONS) for d in ds
    ):
        churn.clear()
    for d in ds:
        if isinstance(d, MigReconfigure):
            churn[d.gpu] = churn.get(d.gpu, 0) + 1
            assert churn[d.gpu] <= 2, f"GPU {d.gpu} re-partitioned again without progress: {d}"


def drive(world: World, data: st.DataObject, n_steps: int) -> None:
    sched = Scheduler(world.cluster, SchedulerConfig(validate=True, seed=7))
    fe = FrontEnd()
    now = 0.0
    counter = [0]
    log: list[tuple[list[Event], float, list[Decision]]] = []
    churn: dict[int, int] = {}
    for _ in range(n_steps):
        if data.draw(st.integers(0, 5), label="wake") == 0:
            wake = sched.next_wakeup()
            if wake is not None and wake > now:
                now = wake
        else:
            now += data.draw(st.sampled_from(DTS), label="dt")
        events = fe.due(now) + random_events(data, world, fe, now, counter)
        fe.observe(events)
        decisions = sched.step(events, now)
        log.append((events, now, decisions))
        if TRACE:
            print(f"t={now:g}\n  events: {events}\n  decisions: {decisions}")
        apply_decisions(fe, decisions, now, data)
        check_mig_progress(churn, events, decisions)
        assert not fe.expect_requeue, f"stopped with requeue but no Requeue: {fe.expect_requeue}"
        check_books(sched, fe)
    # determinism: the same events into a fresh scheduler give the same decisions
    replay = Scheduler(world.cluster, SchedulerConfig(validate=True, seed=7))
    for events, t, decisions in log:
        assert replay.step(events, t) == decisions


# Health checks: the cluster strategy is large by design (many drawn knobs per partition).
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]


@settings(max_examples=int(15 * SCALE), deadline=None, suppress_health_check=_HEALTH)
@given(world=worlds(), data=st.data())
def test_a_few_random_streams_keep_invariants(world: World, data: st.DataObject) -> None:
    """The quick loop's share of the property (``-m "not slow"``); the slow ones explore more."""
    drive(world, data, data.draw(st.integers(5, 40), label="steps"))


@pytest.mark.slow
@settings(max_examples=int(200 * SCALE), deadline=None, suppress_health_check=_HEALTH)
@given(world=worlds(), data=st.data())
def test_random_streams_keep_invariants(world: World, data: st.DataObject) -> None:
    drive(world, data, data.draw(st.integers(5, 40), label="steps"))


@pytest.mark.slow
@settings(
    max_examples=int(70 * SCALE),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(world=worlds(max_parts=3, contended=True), data=st.data())
def test_long_streams_few_partitions(world: World, data: st.DataObject) -> None:
    drive(world, data, 80)
