"""A serving replica that needs more victims than the whole preemption budget (issue 33,
item 2): incident preemption can never serve it within the budget, and its reason says so with
the numbers (before, it said "budget spent (0 of 2 ...)" with no preemption made, and waited
with no wake-up). It still starts when capacity frees up by itself."""

from __future__ import annotations

from scenario_harness import A, JobFinished, flat, make, sub

from gpufence.model.decisions import Bind, Notice, PendingReason, Reason
from gpufence.model.job import WorkloadClass as W
from gpufence.sched.scheduler import Scheduler
from gpufence.testing.builders import ClusterBuilder, PreemptionMode, PreemptionPolicy, job


def fenced(budget: int) -> Scheduler:
    pol = PreemptionPolicy(
        mode=PreemptionMode.INCIDENT_ONLY,
        from_partitions=("train",),
        budget=budget,
        window_s=3600.0,
        min_runtime_s=0.0,
    )
    return make(
        ClusterBuilder()
        .nodes("s", 1, gpus=4)
        .nodes("t", 1, gpus=4)
        .partition("serve", ["s"], admits=frozenset({W.SERVING}), preemption=pol)
        .partition("train", ["t"], admits=frozenset({W.TRAINING}))
        .build()
    )


def started(s: Scheduler) -> None:
    small = [job(f"t{i}").gpus(1).checkpointable().build() for i in range(4)]
    got = flat(s, [(0, sub(job("sv").gpus(4).cls("serving").build(), *small))])
    assert len(got) == 5


def test_a_replica_needing_more_victims_than_the_budget_says_so() -> None:
    s = fenced(budget=2)
    started(s)
    assert s.step(sub(job("r").gpus(4).cls("serving").build()), 10) == []
    assert s.why_pending("r") == PendingReason(
        Reason.PREEMPTION_BUDGET,
        "fence serve is full; making room for it takes 4 incident preemptions (t0, t1, t2, t3) "
        "and the budget allows 2 in 3600 s: incident preemption cannot serve it (it starts when "
        "capacity frees up; raise preemption.budget or use smaller replicas)",
    )
    # nothing timed helps it: no wake-up
    assert s.next_wakeup() is None
    got = s.step([JobFinished("sv")], 20)
    assert got == [Bind("r", "serve", (A(0, 0, 1, 2, 3),))]


def test_within_the_budget_it_is_served() -> None:
    """Control: with a budget of 4 the same replica notices its four victims."""
    s = fenced(budget=4)
    started(s)
    got = s.step(sub(job("r").gpus(4).cls("serving").build()), 10)
    assert [d.job_id for d in got if isinstance(d, Notice)] == ["t0", "t1", "t2", "t3"]
