"""Time limits (``Job.time_limit_s``): an attempt is stopped at its limit with reason
``time-limit`` and ends failed (not requeued); a checkpointable one is noticed its partition's
grace period before, and an ack stops it then. Backfill and reservations trust a time limit;
a job that runs past its estimate no longer holds up a gang's reservation."""

from __future__ import annotations

from scenario_harness import A, CheckpointAck, JobFinished, JobStopped, Tick, make, run, sub

from gpufence.model.decisions import Bind, Notice, Reason, Stop
from gpufence.model.events import JobRestored
from gpufence.sched.jobs import JobState
from gpufence.testing.builders import ClusterBuilder, PreemptionPolicy, job


def cluster(nodes: int = 1, gpus: int = 8):  # type: ignore[no-untyped-def]
    grace = PreemptionPolicy(grace_s=120.0)  # the home partition's grace period
    return ClusterBuilder().nodes("n", nodes, gpus=gpus).partition("p", ["n"], preemption=grace)


def test_an_attempt_is_stopped_at_its_time_limit_and_ends_failed() -> None:
    s = make(cluster().build())
    got = run(
        s,
        [(0.0, sub(job("j").gpus(2).limit(100).build())), (99.0, [Tick()]), (100.0, [Tick()])],
    )
    assert got[1] == []
    assert got[2] == [Stop("j", Reason.TIME_LIMIT, False, "reached its time limit of 100 s")]
    assert s.step([JobStopped("j")], 101.0) == []
    assert s.job("j").state is JobState.FAILED


def test_the_front_end_is_woken_for_the_limit() -> None:
    s = make(cluster().build())
    s.step(sub(job("j").gpus(2).limit(100).build()), 0.0)
    assert s.next_wakeup() == 100.0


def test_a_checkpointable_job_is_noticed_a_grace_period_before_and_stops_on_its_ack() -> None:
    s = make(cluster().build())
    got = run(
        s,
        [
            (0.0, sub(job("j").gpus(2).checkpointable().limit(1000).build())),
            (880.0, [Tick()]),
            (900.0, [CheckpointAck("j")]),
            (901.0, [JobStopped("j")]),
        ],
    )
    why = "time limit of 1000 s ends at t=1000: checkpoint now"
    assert got[1:] == [
        [Notice("j", Reason.TIME_LIMIT, 1000.0, why)],
        [Stop("j", Reason.TIME_LIMIT, False, "checkpoint acknowledged")],
        [],
    ]
    assert s.job("j").state is JobState.FAILED


def test_without_an_ack_the_limit_stops_it_and_it_is_not_requeued() -> None:
    s = make(cluster().build())
    got = run(
        s,
        [
            (0.0, sub(job("j").gpus(2).checkpointable().limit(1000).build())),
            (880.0, [Tick()]),
            (1000.0, [Tick()]),
            (1001.0, [JobStopped("j")]),
        ],
    )
    assert got[2:] == [
        [Stop("j", Reason.TIME_LIMIT, False, "reached its time limit of 1000 s")],
        [],
    ]


def test_a_job_that_ends_before_its_limit_is_not_stopped() -> None:
    s = make(cluster().build())
    got = run(
        s,
        [
            (0.0, sub(job("j").gpus(2).limit(100).build())),
            (50.0, [JobFinished("j")]),
            (100.0, [Tick()]),
        ],
    )
    assert got[1:] == [[], []]
    assert s.next_wakeup() is None


def test_reservations_and_backfill_trust_the_time_limit() -> None:
    """r (6 GPUs, limit 100, no estimate) bounds the gang's start; s with a limit short enough
    backfills, without any estimate."""
    s = make(cluster().build())
    got = run(
        s,
        [
            (0.0, sub(job("r").gpus(6).limit(100).build())),
            (1.0, sub(job("g").gpus(8).build())),
            (2.0, sub(job("s").gpus(2).limit(50).build(), job("t").gpus(2).limit(500).build())),
        ],
    )
    assert got[2] == [
        Bind("s", "p", (A(0, 6, 7),), Reason.BACKFILL, "ends before gang g starts at t=100")
    ]


def test_a_job_past_its_estimate_no_longer_holds_up_the_reservation() -> None:
    """a (est 100) and b (est 200) fill the two nodes; the gang g is reserved on a's node from
    t=100. a overruns: the reservation moves to b's node (from t=200), so s, queued ahead of g
    without an estimate, cannot take b's GPUs when b ends, and g runs then."""
    s = make(cluster(nodes=2, gpus=4).build())
    got = run(
        s,
        [
            (0.0, sub(job("a").gpus(4).est(100).build(), job("b").gpus(4).est(200).build())),
            (1.0, sub(job("s").gpus(1).at(1.0).build(), job("g").gpus(4).at(1.0).build())),
            (150.0, [Tick()]),
            (200.0, [JobFinished("b")]),
        ],
    )
    assert got[1:] == [[], [], [Bind("g", "p", (A(1, 4, 5, 6, 7),))]]


def test_a_restored_attempt_keeps_its_limit() -> None:
    """After a front-end restart the running attempt is still stopped at start + limit."""
    s = make(cluster().build())
    j = job("j").gpus(2).limit(100).build()
    assert s.step([JobRestored(j, "p", (A(0, 0, 1),), started_at=40.0)], 60.0) == []
    assert s.next_wakeup() == 140.0
    assert s.step([Tick()], 140.0) == [
        Stop("j", Reason.TIME_LIMIT, False, "reached its time limit of 100 s")
    ]
