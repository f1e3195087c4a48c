"""The counterexamples the guarantee properties (test_guarantees.py) found under
``HYPOTHESIS_PROFILE=explore``, shrunk by hand into fixed streams, with the same checks after
every step. They cannot be ``@example``s of the properties: those draw their streams through
``st.data()``, which explicit examples do not take."""

from __future__ import annotations

from test_guarantees import (
    Check,
    minimal_reclaim,
    protection_liveness,
    routing_completeness,
    work_conservation,
)

from gpufence.model.events import (
    CheckpointAck,
    Event,
    JobCancelled,
    JobFinished,
    JobStopped,
    JobSubmitted,
    NodeDown,
    NodeUp,
    Tick,
)
from gpufence.model.job import WorkloadClass
from gpufence.model.partition import LendingRule, PreemptionMode, PreemptionPolicy
from gpufence.sched.jobs import JobState
from gpufence.sched.scheduler import Scheduler, SchedulerConfig
from gpufence.testing.builders import ClusterBuilder, job

SERVING = frozenset({WorkloadClass.SERVING})
TRAINING = frozenset({WorkloadClass.TRAINING})


def _check_stream(
    sched: Scheduler, stream: list[tuple[float, list[Event]]], checks: list[Check]
) -> None:
    for now, events in stream:
        decisions = sched.step(events, now)
        for check in checks:
            check(sched, events, decisions, now)


def test_guarantees_hold_when_serving_passes_a_reservation_made_in_the_same_walk() -> None:
    """The counterexample test_guarantees_in_one_shared_partition found (shrunk by hand: the
    draws cannot be replayed through ``st.data()``, which ``@example`` does not take): in one
    8-GPU partition protecting serving, gang g reserves the node in the walk in which serving sv
    passes the reservation and ends it; b (1 GPU, behind g) must not be left waiting with 6 GPUs
    free and no reservation."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.ON_DEMAND, from_partitions=("p0",), budget=1, min_runtime_s=0.0
    )
    cluster = (
        ClusterBuilder("shared")
        .nodes("n", 1, 8, rack="r0")
        .partition("p0", ["n"], preemption=pol, backfill=True)
        .build()
    )
    jobs = [
        job("a").gpus(1).priority(1).build(),
        job("g").gang(2, gpus=4).build(),
        job("b").gpus(1).build(),
        job("sv").gpus(1).cls("serving").build(),
    ]
    sched = Scheduler(cluster, SchedulerConfig(validate=True))
    stream: list[tuple[float, list[Event]]] = [
        (0.0, [JobSubmitted(j) for j in jobs]),
        (1.0, [Tick()]),
    ]
    _check_stream(sched, stream, [work_conservation, protection_liveness])


def test_guarantees_hold_when_a_ready_nominated_job_could_take_a_waiting_ones_gpu() -> None:
    """The counterexample test_guarantees_where_lending_meets_protection found (shrunk by
    hand): serving gang w waits for borrower b with free GPU 3 planned for it; serving v,
    nominated on a free GPU of p1, must bind there, not on GPU 3, or w waits for a victim that
    no longer makes room for it."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.INCIDENT_ONLY, from_partitions=("p1",), budget=4, grace_s=30.0
    )
    rule = LendingRule(to=("p1",), cap_gpus=4, reclaim_deadline_s=120.0)
    cluster = (
        ClusterBuilder("lend")
        .nodes("s", 2, 2, rack="r0")
        .nodes("t", 1, 2, rack="r0")
        .partition("p0", ["s"], admits=SERVING, lending=(rule,), preemption=pol)
        .partition("p1", ["t"], admits=TRAINING)
        .build()
    )
    fill = [job("o1").gpus(1).build(), job("o2").gpus(1).build()]
    b = job("b").gang(3, gpus=1).checkpointable().build()
    w = job("w").gang(2, gpus=2).cls("serving").priority(2).build()
    v = job("v").gpus(1).cls("serving").priority(1).build()
    stream: list[tuple[float, list[Event]]] = [
        (0.0, [JobSubmitted(j) for j in (*fill, b)]),
        (10.0, [JobSubmitted(w)]),
        (20.0, [JobFinished("o2")]),
        (30.0, [JobSubmitted(v)]),
        (31.0, [Tick()]),
        (40.0, [CheckpointAck("b")]),
        (41.0, [JobStopped("b")]),
    ]
    sched = Scheduler(cluster, SchedulerConfig(validate=True))
    _check_stream(sched, stream, [work_conservation, protection_liveness, minimal_reclaim])
    assert sched.job("w").state is JobState.RUNNING


def test_routing_check_matches_a_refusal_to_the_first_submission_of_its_id() -> None:
    """A pinned gang that can never fit, then a routed job under the same id in the same step
    (a duplicate): the refusal is the pinned job's, not a routing failure."""
    cluster = ClusterBuilder().nodes("n", 1, 2).partition("p0", ["n"]).build()
    sched = Scheduler(cluster, SchedulerConfig(validate=True))
    pinned = job("j1").gang(3, gpus=2).partition("p0").build()
    stream: list[tuple[float, list[Event]]] = [
        (0.0, [JobSubmitted(pinned), JobSubmitted(job("j1").gpus(1).build())])
    ]
    _check_stream(sched, stream, [routing_completeness])


def test_guarantees_hold_when_a_waiting_jobs_holds_go() -> None:
    """The counterexample test_guarantees_where_lending_meets_protection found next (shrunk by
    hand): GPUs of p1 held for serving gang w, waiting for its incident victim v, keep b
    waiting; w is cancelled, and b must not wait on with its GPUs free."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.INCIDENT_ONLY, from_partitions=("p1",), budget=4, min_runtime_s=0.0
    )
    cluster = (
        ClusterBuilder("lend")
        .nodes("s", 2, 2, rack="r0")
        .nodes("t", 2, 2, rack="r0")
        .partition("p0", ["s"], admits=SERVING, preemption=pol)
        .partition("p1", ["t"], admits=TRAINING)
        .build()
    )
    fill = [
        job("s0").gpus(1).cls("serving").build(),
        job("s1").gpus(1).cls("serving").build(),
        job("v").gpus(1).checkpointable().build(),
    ]
    w = job("w").gang(2, gpus=2).cls("serving").build()
    stream: list[tuple[float, list[Event]]] = [
        (0.0, [JobSubmitted(j) for j in fill]),
        (10.0, [JobSubmitted(w)]),
        (11.0, [JobSubmitted(job("b").gpus(1).build())]),
        (12.0, [JobCancelled("w")]),
    ]
    sched = Scheduler(cluster, SchedulerConfig(validate=True))
    _check_stream(sched, stream, [work_conservation, protection_liveness])


def test_guarantees_hold_when_a_waiting_jobs_victims_no_longer_make_room() -> None:
    """The other counterexample of that run (shrunk by hand): gang w waits for v; a node of
    its plan fails and comes back, and meanwhile x took what v was to free. w must be
    protected again at once (x noticed), not wait for v in vain."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.INCIDENT_ONLY,
        from_partitions=("p1",),
        budget=4,
        min_runtime_s=0.0,
        grace_s=30.0,
    )
    cluster = (
        ClusterBuilder("lend")
        .nodes("s", 2, 2, rack="r0")
        .nodes("t", 2, 2, rack="r0")
        .partition("p0", ["s"], admits=SERVING, preemption=pol)
        .partition("p1", ["t"], admits=TRAINING)
        .build()
    )
    fill = [job(f"s{i}").gpus(1).cls("serving").build() for i in range(2)]
    v, x = (job(j).gpus(1).checkpointable().build() for j in ("v", "x"))
    stream: list[tuple[float, list[Event]]] = [
        (0.0, [JobSubmitted(j) for j in (*fill, v)]),
        (10.0, [JobSubmitted(job("w").gang(2, gpus=2).cls("serving").build())]),
        (11.0, [NodeDown("t-1")]),
        (12.0, [JobSubmitted(x)]),
        (13.0, [NodeUp("t-1")]),
        (40.0, [Tick()]),
        (41.0, [JobStopped("v")]),
        (43.0, [Tick()]),
        (44.0, [JobStopped("x")]),
    ]
    sched = Scheduler(cluster, SchedulerConfig(validate=True))
    _check_stream(sched, stream, [work_conservation, protection_liveness, minimal_reclaim])
    assert sched.job("w").state is JobState.RUNNING


def test_guarantees_hold_when_a_node_failure_leaves_what_comes_back_to_the_next_job() -> None:
    """test_guarantees_in_one_shared_partition, seed 401 (shrunk by hand): serving a waits
    for b1, serving b behind it cannot be helped; b1 is stopping when a node of a's plan
    fails, so what b1 frees no longer fits a: protection must look again and nominate b."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.ON_DEMAND,
        from_partitions=("p0",),
        budget=1,
        grace_s=30.0,
        min_runtime_s=0.0,
    )
    cluster = (
        ClusterBuilder("shared")
        .nodes("n", 3, 2, rack="r0")
        .partition("p0", ["n"], preemption=pol, backfill=True)
        .build()
    )
    fill = [job("b1").gang(3, gpus=1).priority(3).build(), job("o").gpus(1).build()]
    a = job("a").gang(5, gpus=1).cls("serving").build()
    b = job("b").gang(3, gpus=1).cls("serving").build()
    stream: list[tuple[float, list[Event]]] = [
        (0.0, [JobSubmitted(j) for j in fill]),
        (1.0, [JobSubmitted(a)]),
        (2.0, [JobSubmitted(b)]),
        (3.0, [CheckpointAck("b1")]),
        (4.0, [NodeDown("n-0")]),
        (5.0, [JobStopped("b1")]),
    ]
    sched = Scheduler(cluster, SchedulerConfig(validate=True))
    _check_stream(sched, stream, [work_conservation, protection_liveness])
    assert sched.job("b").state is JobState.RUNNING


def test_guarantees_hold_when_one_batch_nominates_two_jobs_on_shared_victims() -> None:
    """test_guarantees_in_one_shared_partition, seed 503 (shrunk by hand): r1 and r2 are
    nominated in one batch, r2 on all its victims; t exits during its notice and is requeued.
    What t freed must stay r2's, so that b's stop makes room for both."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.ON_DEMAND,
        from_partitions=("p0",),
        budget=4,
        grace_s=120.0,
        min_runtime_s=0.0,
    )
    cluster = (
        ClusterBuilder("shared")
        .nodes("n", 1, 8, rack="r0")
        .partition("p0", ["n"], preemption=pol, backfill=True)
        .build()
    )
    fill = [
        job("b").gang(3, gpus=1).priority(3).build(),
        job("t").gpus(3).priority(3).checkpointable().build(),
        job("f").gpus(2).build(),
    ]
    serving = [
        job("r1").gang(3, gpus=1).cls("serving").priority(2).build(),
        job("r2").gang(2, gpus=2).cls("serving").priority(2).build(),
    ]
    stream: list[tuple[float, list[Event]]] = [
        (0.0, [JobSubmitted(j) for j in fill]),
        (1.0, [JobSubmitted(j) for j in serving]),
        (2.0, [JobFinished("f")]),
        (130.0, [JobFinished("t", False)]),
        (140.0, [JobStopped("b")]),
    ]
    sched = Scheduler(cluster, SchedulerConfig(validate=True))
    _check_stream(sched, stream, [work_conservation, protection_liveness])
    assert all(sched.job(j).state is JobState.RUNNING for j in ("r1", "r2"))
