"""Issue 33, item 10: what the scheduler says must stay true -- a job waiting for victims names
them even when they were chosen in the same batch; a gang whose start counted on a backfilled
job names that job once it overruns its estimate; a fractional no-fit names only what is short;
on-demand preemption honours ``min_runtime_s``; a stop no decision asked for is logged."""

from __future__ import annotations

from scenario_harness import A, JobFinished, JobStopped, Tick, make, serve_and_train, sub

from gpufence.model.decisions import Bind, Notice, PendingReason, Reason, Requeue, Stop
from gpufence.model.job import WorkloadClass as W
from gpufence.sched.jobs import JobState
from gpufence.sched.scheduler import Scheduler
from gpufence.testing.builders import (
    ClusterBuilder,
    PreemptionMode,
    PreemptionPolicy,
    SharingMode,
    job,
)

SERVING = frozenset({W.SERVING})
TRAINING = frozenset({W.TRAINING})


def test_a_job_covered_by_a_victim_of_its_own_batch_names_it() -> None:
    """r1 and r2 (2 GPUs each) arrive together; reclaiming ck's 4 lent GPUs for r1 also makes
    room for r2, which was told "waiting for nothing to stop": its reason was written before
    the batch's notices went out."""
    s = serve_and_train(lend=4)
    s.step(sub(job("own").gpus(4).build(), job("ck").gpus(4).checkpointable().build()), 0.0)
    got = s.step(
        sub(job("r1").gpus(2).cls("serving").build(), job("r2").gpus(2).cls("serving").build()),
        10.0,
    )
    assert got == [
        Notice("ck", Reason.LENT_RECLAIM, 70.0, "partition serve reclaims its lent GPUs for r1")
    ]
    waiting = PendingReason(
        Reason.WAITING_PREEMPTION, "waiting for ck to stop (notice deadline t=70)"
    )
    assert s.why_pending("r1") == waiting
    assert s.why_pending("r2") == waiting


def _gang_behind_a_backfill() -> Scheduler:
    """One 8-GPU node: r (4 GPUs, estimate 1000 s) runs, gang g (8 GPUs) reserves from t=1000,
    b (4 GPUs, estimate 500 s) backfills at t=100 on the reserved GPUs."""
    s = make(ClusterBuilder().nodes("n", 1, gpus=8).partition("p", ["n"]).build())
    s.step(sub(job("r").gpus(4).est(1000).build()), 0.0)
    s.step(sub(job("g").gpus(8).build()), 10.0)
    got = s.step(sub(job("b").gpus(4).est(500).build()), 100.0)
    assert got == [
        Bind("b", "p", (A(0, 4, 5, 6, 7),), Reason.BACKFILL, "ends before gang g starts at t=1000")
    ]
    return s


def test_a_backfilled_job_that_overruns_its_estimate_is_named() -> None:
    """Issue 33, item 10: "GPUs reserved from t=1000" stayed while b ran past its estimate
    (due t=600) on GPUs the gang needs, and after r ended at t=1000 too."""
    s = _gang_behind_a_backfill()
    named = (
        "GPUs reserved from when running jobs end: b ran past its 500 s estimate, due t=600, "
        "and holds 4 of them"
    )
    assert s.step([Tick()], 601.0) == []
    assert s.why_pending("g") == PendingReason(
        Reason.NO_FIT, f"partition p has 0 of 8 GPUs free; {named}"
    )
    assert s.step([JobFinished("r")], 1000.0) == []
    assert s.why_pending("g") == PendingReason(
        Reason.NO_FIT, f"needs 8 free GPUs, partition p has 4 free; {named}"
    )
    assert s.step([JobFinished("b")], 1100.0) == [
        Bind("g", "p", (A(0, 0, 1, 2, 3, 4, 5, 6, 7),), Reason.FITS, "")
    ]


def test_a_backfilled_job_within_its_estimate_keeps_the_start() -> None:
    s = _gang_behind_a_backfill()
    assert s.step([Tick()], 599.0) == []
    assert s.why_pending("g") == PendingReason(
        Reason.NO_FIT, "partition p has 0 of 8 GPUs free; GPUs reserved from t=1000"
    )


def test_a_fractional_no_fit_names_only_what_is_short() -> None:
    """'needs 0.5 GPUs and 0 CPUs, 0.1 GPUs and 64 CPUs free' read as if CPUs were short."""
    s = make(
        ClusterBuilder()
        .nodes("f", 1, gpus=1)
        .partition("f", ["f"], sharing=SharingMode.FRACTIONAL)
        .build()
    )
    s.step(sub(job("a").fraction(900).build(), job("b").fraction(500).build()), 0.0)
    assert s.why_pending("b") == PendingReason(
        Reason.NO_FIT, "f has no room for 500m GPU: needs 0.5 GPUs, 0.1 free"
    )


def _on_demand(min_runtime: float) -> Scheduler:
    pol = PreemptionPolicy(
        mode=PreemptionMode.ON_DEMAND,
        from_partitions=("train",),
        min_runtime_s=min_runtime,
        grace_s=120.0,
    )
    s = serve_and_train(pol)
    s.step(sub(job("sv0").gpus(4).cls("serving").build()), 0.0)
    s.step(sub(job("t1").gpus(4).build()), 100.0)  # not checkpointable: on demand takes it
    return s


def test_on_demand_preemption_waits_for_the_minimum_runtime() -> None:
    """Issue 33, item 10: on-demand preemption ignored ``min_runtime_s`` (t1 was preempted
    100 s into its run under a 600 s minimum)."""
    s = _on_demand(600.0)
    assert s.step(sub(job("sv1").gpus(2).cls("serving").build()), 200.0) == []
    assert s.why_pending("sv1") == PendingReason(
        Reason.MIN_RUNTIME,
        "preempting t1 in train would make room, but jobs run at least min_runtime_s 600 "
        "before they are preempted (these may be from t=700)",
    )
    assert s.next_wakeup() == 700.0
    why = "serving job sv1 needs GPUs its fence serve cannot hold"
    assert s.step([Tick()], 700.0) == [Notice("t1", Reason.ON_DEMAND_PREEMPTION, 820.0, why)]


def test_on_demand_without_a_minimum_runtime_preempts_at_once() -> None:
    s = _on_demand(0.0)
    why = "serving job sv1 needs GPUs its fence serve cannot hold"
    assert s.step(sub(job("sv1").gpus(2).cls("serving").build()), 200.0) == [
        Notice("t1", Reason.ON_DEMAND_PREEMPTION, 320.0, why)
    ]


def test_a_stop_no_decision_asked_for_is_logged_and_requeued() -> None:
    """Issue 33, item 10: an unsolicited JobStopped made the job failed, with no decision."""
    s = make(ClusterBuilder().nodes("n", 1, gpus=2).partition("p", ["n"]).build())
    s.step(sub(job("x").gpus(1).build()), 0.0)
    got = s.step([JobStopped("x")], 50.0)
    why = "reported stopped, but no stop was decided for it: its outcome is unknown"
    assert got == [
        Stop("x", Reason.LOST, True, why),
        Requeue("x", Reason.LOST, 2, "back in its queue"),
        Bind("x", "p", (A(0, 0),), Reason.FITS, ""),
    ]
    assert s.job("x").state is JobState.RUNNING and s.job("x").attempt == 2
