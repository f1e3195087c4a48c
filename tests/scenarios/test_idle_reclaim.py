"""Idle reclaim of interactive sessions: Notice(idle) after ``idle_after_s`` without Activity at
or above ``idle_threshold``, NoticeWithdrawn when active again, Stop(requeue=False) at the
warning deadline; the job ends RECLAIMED once JobStopped arrives."""

from __future__ import annotations

import pytest
from scenario_harness import (
    A,
    Activity,
    CheckpointAck,
    JobStopped,
    Step,
    Tick,
    flat,
    make,
    run,
    sub,
)

from gpufence.model.decisions import Bind, Decision, Notice, NoticeWithdrawn, Reason, Stop
from gpufence.sched.jobs import JobState
from gpufence.sched.scheduler import Scheduler
from gpufence.testing.builders import ClusterBuilder, ReclaimPolicy, job

POLICY = ReclaimPolicy(idle_threshold=0.1, idle_after_s=100.0, warning_s=30.0)
RECLAIMED = "idle session reclaimed after its warning"


def nb_cluster(reclaim: ReclaimPolicy | None = POLICY):  # type: ignore[no-untyped-def]
    return ClusterBuilder().nodes("n", 1, gpus=2).partition("nb", ["n"], reclaim=reclaim).build()


def warned(idle_for: float, deadline: float) -> Notice:
    return Notice(
        "i",
        Reason.IDLE,
        deadline,
        f"idle for {idle_for:.0f} s (activity < 0.1); "
        f"GPUs reclaimed in {POLICY.warning_s:.0f} s unless it becomes active",
    )


def session() -> Scheduler:
    s = make(nb_cluster())
    assert s.step(sub(job("i").gpus(1).cls("interactive").build()), 0) == [
        Bind("i", "nb", (A(0, 0),))
    ]
    return s


CASES: list[object] = [
    pytest.param(
        [(99, [Tick()]), (100, [Tick()]), (129, [Tick()]), (130, [Tick()])],
        [warned(100, 130), Stop("i", Reason.IDLE, False, RECLAIMED)],
        id="an idle session is warned then stopped at the warning deadline",
    ),
    pytest.param(
        [(50, [Activity("i", 0.5)]), (100, [Tick()]), (150, [Tick()])],
        [warned(100, 180)],
        id="activity at or above the threshold restarts the idle clock",
    ),
    pytest.param(
        [(50, [Activity("i", 0.05)]), (100, [Tick()])],
        [warned(100, 130)],
        id="activity below the threshold counts as idle",
    ),
    pytest.param(
        [(50, [Activity("i", 0.1)]), (100, [Tick()]), (150, [Tick()])],
        [warned(100, 180)],
        id="activity exactly at the threshold counts as active",
    ),
    pytest.param(
        [(100, [Tick()]), (110, [Activity("i", 0.9)]), (130, [Tick()]), (210, [Tick()])],
        [
            warned(100, 130),
            NoticeWithdrawn("i", Reason.ACTIVE_AGAIN, "session active again"),
            warned(100, 240),
        ],
        id="a warned session that becomes active again keeps its GPUs",
    ),
    pytest.param(
        [(100, [Tick()]), (110, [CheckpointAck("i")]), (129, [Tick()])],
        [warned(100, 130)],
        id="a checkpoint acknowledgement does not end an idle warning early",
    ),
]


@pytest.mark.parametrize(("steps", "expected"), CASES)
def test_idle_reclaim(steps: list[Step], expected: list[Decision]) -> None:
    s = session()
    assert flat(s, steps) == expected


def test_reclaimed_session_ends_reclaimed_without_requeue() -> None:
    s = session()
    got = run(s, [(100, [Tick()]), (130, [Tick()]), (131, [JobStopped("i")])])
    assert got[-1] == []
    assert s.job("i").state is JobState.RECLAIMED
    assert s.ledger.allocs == {}
    assert s.counters.reclaims[Reason.IDLE] == 1


def test_reclaimed_gpu_goes_to_waiting_work() -> None:
    s = session()
    got = flat(
        s,
        [
            (1, sub(job("w").gpus(2).build())),
            (100, [Tick()]),
            (130, [Tick()]),
            (131, [JobStopped("i")]),
        ],
    )
    assert got == [
        warned(100, 130),
        Stop("i", Reason.IDLE, False, RECLAIMED),
        Bind("w", "nb", (A(0, 0, 1),)),
    ]


def test_only_interactive_jobs_are_reclaimed() -> None:
    s = make(nb_cluster())
    s.step(sub(job("t").gpus(1).cls("training").build()), 0)
    assert flat(s, [(100, [Tick()]), (1000, [Tick()])]) == []


def test_partition_without_reclaim_policy_never_reclaims() -> None:
    s = make(nb_cluster(reclaim=None))
    s.step(sub(job("i").gpus(1).cls("interactive").build()), 0)
    assert flat(s, [(100, [Tick()]), (10_000, [Tick()])]) == []


def test_next_wakeup_names_the_idle_and_warning_deadlines() -> None:
    s = session()
    assert s.next_wakeup() == 100
    s.step([Activity("i", 1.0)], 40)
    assert s.next_wakeup() == 140
    s.step([Tick()], 140)
    assert s.next_wakeup() == 170
