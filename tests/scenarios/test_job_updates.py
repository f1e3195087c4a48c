"""Changing a job after submit (``JobUpdated``, ``sched/update.py``) and hold / release: the
core's exact decisions, step by step, and what ``judge`` tells a front end before it sends one.

The cluster: partition ``p`` (one node, 2 GPUs) and partition ``q`` (one node, 2 GPUs, with a
grace period of 120 s for checkpointable jobs' time-limit notices)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from scenario_harness import A, JobFinished, Tick, make, sub

from gpufence.model.decisions import (
    Bind,
    Decision,
    Notice,
    NoticeWithdrawn,
    PendingReason,
    Reason,
    Stop,
)
from gpufence.model.events import Event, JobHeld, JobReleased, JobUpdated
from gpufence.model.job import Job
from gpufence.sched.intake import Accepted, Refused
from gpufence.sched.jobs import JobState
from gpufence.sched.update import Conflict, judge
from gpufence.testing.builders import ClusterBuilder, PreemptionPolicy, job


def cluster():  # type: ignore[no-untyped-def]
    grace = PreemptionPolicy(grace_s=120.0)
    return (
        ClusterBuilder()
        .nodes("a", 1, gpus=2)
        .nodes("b", 1, gpus=2)
        .partition("p", ["a"], preemption=grace)
        .partition("q", ["b"], preemption=grace)
        .build()
    )


def two(jid: str, at: float = 0.0, **kw: object) -> Job:
    b = job(jid).gpus(2).partition("p").at(at)
    if "limit" in kw:
        b = b.limit(float(kw["limit"]))  # type: ignore[arg-type]
    if kw.get("ckpt"):
        b = b.checkpointable()
    return b.build()


Step = tuple[float, Sequence[Event]]

# (name, steps, the decisions of each step): every step's list exactly
CASES: list[tuple[str, list[Step], list[list[Decision]]]] = [
    (
        "a raised priority runs a pending job ahead of one submitted before it",
        [
            (0, sub(two("run"))),
            (1, sub(two("a", 1), two("b", 2))),
            (3, [JobUpdated("b", priority=5)]),
            (10, [JobFinished("run")]),
        ],
        [[Bind("run", "p", (A(0, 0, 1),))], [], [], [Bind("b", "p", (A(0, 0, 1),))]],
    ),
    (
        "a lowered priority lets the job submitted after it go first",
        [
            (0, sub(two("run"))),
            (1, sub(two("a", 1), two("b", 2))),
            (3, [JobUpdated("a", priority=-1)]),
            (10, [JobFinished("run")]),
        ],
        [[Bind("run", "p", (A(0, 0, 1),))], [], [], [Bind("b", "p", (A(0, 0, 1),))]],
    ),
    (
        "released, a held job is back in its place: ahead of one submitted at the same time",
        [
            (0, sub(two("run"))),
            (1, sub(two("a", 1), two("b", 1))),
            (2, [JobHeld("a", by="alice")]),
            (3, [JobReleased("a")]),
            (10, [JobFinished("run")]),
        ],
        [[Bind("run", "p", (A(0, 0, 1),))], [], [], [], [Bind("a", "p", (A(0, 0, 1),))]],
    ),
    (
        "released, a held job goes ahead of the gang that reserved the GPUs while it was held",
        [
            (0, sub(job("run").gpus(1).partition("p").build())),
            (1, sub(two("a", 1))),
            (2, [JobHeld("a")]),
            (3, sub(two("b", 3))),  # b is the head now: GPUs reserved for it
            (4, [JobReleased("a")]),
            (10, [JobFinished("run")]),
        ],
        [[Bind("run", "p", (A(0, 0),))], [], [], [], [], [Bind("a", "p", (A(0, 0, 1),))]],
    ),
    (
        "moved into a partition, an earlier job goes ahead of the gang reserved there",
        [
            (0, sub(job("run").gpus(1).partition("q").build(), two("x"))),
            (1, sub(two("a", 1))),
            (3, sub(job("b").gpus(2).partition("q").at(3).build())),  # reserved in q
            (4, [JobUpdated("a", partition="q")]),
            (10, [JobFinished("run")]),
        ],
        [
            [Bind("x", "p", (A(0, 0, 1),)), Bind("run", "q", (A(1, 2),))],
            [],
            [],
            [],
            [Bind("a", "q", (A(1, 2, 3),))],
        ],
    ),
    (
        "updated, a pending job keeps its place among jobs of its submit time",
        [
            (0, sub(two("run"))),
            (1, sub(two("a", 1), two("b", 1))),
            (2, [JobUpdated("a", time_limit_s=50.0)]),
            (10, [JobFinished("run")]),
        ],
        [[Bind("run", "p", (A(0, 0, 1),))], [], [], [Bind("a", "p", (A(0, 0, 1),))]],
    ),
    (
        "a pending job moved to a free partition binds there in the same step",
        [(0, sub(two("run"))), (1, sub(two("a", 1))), (2, [JobUpdated("a", partition="q")])],
        [[Bind("run", "p", (A(0, 0, 1),))], [], [Bind("a", "q", (A(1, 2, 3),))]],
    ),
    (
        "a pending job moved to another partition and its queue goes there too",
        [
            (0, sub(two("run"))),
            (1, sub(two("a", 1))),
            (2, [JobUpdated("a", partition="q", queue="q")]),
        ],
        [[Bind("run", "p", (A(0, 0, 1),))], [], [Bind("a", "q", (A(1, 2, 3),))]],
    ),
    (
        "a move to a partition that cannot hold the job is dropped: it stays where it was",
        [
            (0, sub(two("run"))),
            (1, sub(two("a", 1))),
            (2, [JobUpdated("a", partition="nowhere")]),
            (10, [JobFinished("run")]),
        ],
        [[Bind("run", "p", (A(0, 0, 1),))], [], [], [Bind("a", "p", (A(0, 0, 1),))]],
    ),
    (
        "a lowered time limit stops a running job at the new limit",
        [
            (0, sub(two("j", limit=100))),
            (10, [JobUpdated("j", time_limit_s=50.0)]),
            (49, [Tick()]),
            (50, [Tick()]),
        ],
        [
            [Bind("j", "p", (A(0, 0, 1),))],
            [],
            [],
            [Stop("j", Reason.TIME_LIMIT, False, "reached its time limit of 50 s")],
        ],
    ),
    (
        "a limit lowered below the time it has run stops it in the same step",
        [(0, sub(two("j", limit=100))), (10, [JobUpdated("j", time_limit_s=5.0)])],
        [
            [Bind("j", "p", (A(0, 0, 1),))],
            [Stop("j", Reason.TIME_LIMIT, False, "reached its time limit of 5 s")],
        ],
    ),
    (
        "a raised time limit is not stopped at the old one, but at the new one",
        [
            (0, sub(two("j", limit=100))),
            (10, [JobUpdated("j", time_limit_s=200.0)]),
            (100, [Tick()]),
            (200, [Tick()]),
        ],
        [
            [Bind("j", "p", (A(0, 0, 1),))],
            [],
            [],
            [Stop("j", Reason.TIME_LIMIT, False, "reached its time limit of 200 s")],
        ],
    ),
    (
        "a raised limit withdraws a checkpointable job's time-limit notice; noticed again later",
        [
            (0, sub(two("j", limit=1000, ckpt=True))),
            (880, [Tick()]),
            (900, [JobUpdated("j", time_limit_s=2000.0)]),
            (1000, [Tick()]),
            (1880, [Tick()]),
        ],
        [
            [Bind("j", "p", (A(0, 0, 1),))],
            [
                Notice(
                    "j",
                    Reason.TIME_LIMIT,
                    1000.0,
                    "time limit of 1000 s ends at t=1000: checkpoint now",
                )
            ],
            [
                NoticeWithdrawn(
                    "j", Reason.TIME_LIMIT, "time limit changed to 2000 s: it now ends at t=2000"
                )
            ],
            [],
            [
                Notice(
                    "j",
                    Reason.TIME_LIMIT,
                    2000.0,
                    "time limit of 2000 s ends at t=2000: checkpoint now",
                )
            ],
        ],
    ),
    (
        "a running job's move to another partition is dropped: it keeps running where it is",
        [(0, sub(two("j", limit=100))), (10, [JobUpdated("j", partition="q")]), (100, [Tick()])],
        [
            [Bind("j", "p", (A(0, 0, 1),))],
            [],
            [Stop("j", Reason.TIME_LIMIT, False, "reached its time limit of 100 s")],
        ],
    ),
]


@pytest.mark.parametrize(
    ("steps", "want"), [(s, w) for _, s, w in CASES], ids=[c[0] for c in CASES]
)
def test_updates_decide_exactly(steps: list[Step], want: list[list[Decision]]) -> None:
    s = make(cluster())
    got = [s.step(list(events), float(t)) for t, events in steps]
    assert got == want


def test_a_raised_limit_moves_the_wakeup() -> None:
    s = make(cluster())
    s.step(sub(two("j", limit=100)), 0.0)
    assert s.next_wakeup() == 100.0
    s.step([JobUpdated("j", time_limit_s=300.0)], 1.0)
    assert s.next_wakeup() == 300.0


def test_a_held_job_names_who_held_it_and_waits_until_released() -> None:
    s = make(cluster())
    s.step(sub(two("run"), two("a", 1)), 1.0)
    s.step([JobHeld("a", by="alice")], 2.0)
    assert s.why_pending("a") == PendingReason(
        Reason.HELD, "held by alice; release it to let it run"
    )
    assert s.step([JobFinished("run")], 3.0) == []  # free GPUs, and it still waits
    assert s.step([JobReleased("a")], 4.0) == [Bind("a", "p", (A(0, 0, 1),))]


def test_a_job_submitted_held_names_who_held_it() -> None:
    s = make(cluster())
    s.step(sub(job("a").gpus(1).held().build()), 0.0)
    assert s.why_pending("a") == PendingReason(Reason.HELD, "held; release it to let it run")


def test_a_pending_update_changes_its_pending_reason_and_queue() -> None:
    s = make(cluster())
    s.step(sub(two("run"), two("a", 1)), 1.0)
    s.step([JobUpdated("a", partition="q", priority=3)], 2.0)
    rec = s.job("a")
    assert (rec.home, rec.queue, rec.job.priority, rec.state) == ("q", "q", 3, JobState.RUNNING)


# (what the job is, the change, the verdict judge gives a front end)
JUDGE_CASES = [
    pytest.param(
        "pending", JobUpdated("a", partition="q"), Accepted("q", "q"), id="pending-partition"
    ),
    pytest.param(
        "pending",
        JobUpdated("a", partition="nowhere"),
        Refused(Reason.INVALID, "partition 'nowhere' does not exist (known: p, q)"),
        id="pending-unknown-partition",
    ),
    pytest.param(
        "pending",
        JobUpdated("a", time_limit_s=-1.0),
        Refused(Reason.INVALID, "time_limit_s must be between 0 and 1000000000000 (got -1.0)"),
        id="pending-bad-limit",
    ),
    pytest.param(
        "pending",
        JobUpdated("a", queue="q"),
        Refused(Reason.INVALID, "queue q belongs to partition q, not p"),
        id="pending-queue-of-another-partition",
    ),
    pytest.param(
        "running", JobUpdated("a", time_limit_s=10.0), Accepted("p", "p"), id="running-limit"
    ),
    pytest.param(
        "running",
        JobUpdated("a", queue="q"),
        Conflict(
            "job a is running: its partition and queue change only while it is pending; "
            "cancel it and submit it again to the other partition or queue (its priority "
            "and time limit may change while it runs)"
        ),
        id="running-queue",
    ),
    pytest.param(
        "done",
        JobUpdated("a", priority=1),
        Conflict("job a is done: only a pending or running job can change"),
        id="done",
    ),
]


@pytest.mark.parametrize(("state", "ev", "verdict"), JUDGE_CASES)
def test_judge_tells_the_front_end(state: str, ev: JobUpdated, verdict: object) -> None:
    s = make(cluster())
    if state == "pending":
        s.step(sub(two("run"), two("a", 1)), 1.0)
    else:
        s.step(sub(two("a", 1)), 1.0)
    if state == "done":
        s.step([JobFinished("a")], 2.0)
    assert judge(s.cluster, s.jobs().get("a"), ev) == verdict


def test_a_move_into_a_queue_whose_quota_can_never_hold_the_job_is_refused() -> None:
    """Quotas as at submit: a 2-GPU job may not move into a queue capped at 1 GPU."""
    c = (
        ClusterBuilder()
        .nodes("a", 1, gpus=2)
        .partition("p", ["a"])
        .queue("big", "p")
        .queue("small", "p", nominal_milli=1000, borrowing_limit_milli=0)
        .build()
    )
    s = make(c)
    s.step(sub(two("run"), job("a").gpus(2).queue("big").at(1).build()), 1.0)
    got = judge(s.cluster, s.jobs().get("a"), JobUpdated("a", queue="small"))
    assert got == Refused(Reason.NEVER_FITS, "needs 2 GPUs but queue small may hold at most 1")
    assert s.step([JobUpdated("a", queue="small")], 2.0) == []
    assert s.job("a").queue == "big"  # dropped by the core as the plane refused it
