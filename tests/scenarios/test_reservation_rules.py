"""Who a gang's reservation holds GPUs against (issue 33, items 3 and 7):

- ``backfill: false`` turns off backfill into the reserved GPUs, not the reservation: the gang
  is still protected from the jobs queued behind it (before, 1-GPU jobs kept starting ahead of
  an 8-GPU gang that never started);
- in a fence that protects serving, a serving gang whose start is unknown does not hold idle
  GPUs against the serving jobs behind it (before, a 1-GPU replica waited beside 4 idle GPUs
  for as long as protection needed to find the gang victims).
"""

from __future__ import annotations

from scenario_harness import A, JobFinished, Tick, flat, make, sub

from gpufence.model.decisions import Bind, Notice, PendingReason, Reason
from gpufence.model.job import WorkloadClass as W
from gpufence.sched.scheduler import Scheduler
from gpufence.testing.builders import ClusterBuilder, PreemptionMode, PreemptionPolicy, job


def one_node(backfill: bool) -> Scheduler:
    return make(
        ClusterBuilder().nodes("n", 1, gpus=8).partition("p", ["n"], backfill=backfill).build()
    )


def test_backfill_off_keeps_the_gang_protected_from_the_jobs_behind_it() -> None:
    s = one_node(backfill=False)
    got = flat(
        s,
        [
            (0, sub(job("r").gpus(6).est(100).build())),
            (1, sub(job("g").gpus(8).build())),
            # ends long before the gang could start: with backfill on it would backfill
            (2, sub(job("s").gpus(2).est(10).build(), job("t").gpus(1).build())),
        ],
    )
    assert got == [Bind("r", "p", (A(0, 0, 1, 2, 3, 4, 5),))]
    held = PendingReason(Reason.RESERVED_FOR_GANG, "GPUs reserved for gang g (starts by t=100)")
    assert s.why_pending("s") == held
    assert s.why_pending("t") == held
    assert s.step([JobFinished("r")], 100) == [Bind("g", "p", (A(0, 0, 1, 2, 3, 4, 5, 6, 7),))]


def test_backfill_on_lets_a_job_that_ends_before_the_gang_in() -> None:
    """Control: the same stream with backfill on backfills s (and only s)."""
    s = one_node(backfill=True)
    got = flat(
        s,
        [
            (0, sub(job("r").gpus(6).est(100).build())),
            (1, sub(job("g").gpus(8).build())),
            (2, sub(job("s").gpus(2).est(10).build(), job("t").gpus(1).build())),
        ],
    )
    assert got == [
        Bind("r", "p", (A(0, 0, 1, 2, 3, 4, 5),)),
        Bind("s", "p", (A(0, 6, 7),), Reason.BACKFILL, "ends before gang g starts at t=100"),
    ]


def serving_fence() -> Scheduler:
    """serve: one 8-GPU node protected by incident preemption from train (one 8-GPU node)."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.INCIDENT_ONLY, from_partitions=("train",), budget=4, min_runtime_s=600
    )
    return make(
        ClusterBuilder()
        .nodes("s", 1, gpus=8)
        .nodes("t", 1, gpus=8)
        .partition("serve", ["s"], admits=frozenset({W.SERVING}), preemption=pol)
        .partition("train", ["t"], admits=frozenset({W.TRAINING}))
        .build()
    )


def test_a_serving_replica_does_not_wait_beside_idle_gpus_held_for_a_serving_gang() -> None:
    s = serving_fence()
    sv = job("sv").gpus(4).cls("serving").build()
    t1 = job("t1").gpus(8).checkpointable().build()
    big = job("big").gpus(8).cls("serving").build()
    got = flat(s, [(0, sub(sv, t1)), (10, sub(big))])
    assert got == [
        Bind("sv", "serve", (A(0, 0, 1, 2, 3),)),
        Bind("t1", "train", (A(1, *range(8, 16)),)),
    ]
    # big cannot fit at home before sv ends (never: serving runs until scaled down), and t1 is
    # too young to preempt until t=600
    assert s.why_pending("big") == PendingReason(
        Reason.MIN_RUNTIME,
        "preempting t1 in train would make room, but jobs run at least min_runtime_s 600 "
        "before they are preempted (these may be from t=600)",
    )
    assert s.step(sub(job("r").gpus(1).cls("serving").build()), 20) == [
        Bind("r", "serve", (A(0, 4),))
    ]
    assert s.step([Tick()], 600) == [
        Notice(
            "t1",
            Reason.INCIDENT_PREEMPTION,
            720.0,
            "serving job big needs GPUs its fence serve cannot hold",
        )
    ]
