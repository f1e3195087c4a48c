"""Fences and declared lending: a job runs only where its class is admitted; capacity crosses a
fence only through a LendingRule (checkpointable work only) and is reclaimed by its owner with a
Notice -> Stop -> Requeue handshake."""

from __future__ import annotations

import pytest
from scenario_harness import A, CheckpointAck, JobFinished, JobStopped, Tick, flat, make, sub

from gpufence.model.decisions import Bind, Notice, Reason, Reject, Requeue, Stop
from gpufence.model.job import WorkloadClass as W
from gpufence.sched.jobs import JobState
from gpufence.testing.builders import ClusterBuilder, LendingRule, job

SERVING = frozenset({W.SERVING})
TRAINING = frozenset({W.TRAINING})


def fenced(cap: int = 2, deadline: float = 60.0, checkpointable_only: bool = True):  # type: ignore[no-untyped-def]
    """serve: node 0 (GPUs 0-3), lends ``cap`` GPUs to train; train: node 1 (GPUs 4-7)."""
    rule = LendingRule(
        to=("train",),
        cap_gpus=cap,
        reclaim_deadline_s=deadline,
        checkpointable_only=checkpointable_only,
    )
    return (
        ClusterBuilder()
        .nodes("s", 1, gpus=4)
        .nodes("t", 1, gpus=4)
        .partition("serve", ["s"], admits=SERVING, lending=(rule,))
        .partition("train", ["t"], admits=TRAINING)
        .build()
    )


def test_each_class_runs_only_in_its_own_fence() -> None:
    s = make(fenced())
    got = s.step(
        sub(
            job("sv").gpus(2).cls("serving").build(),
            job("tr").gpus(2).cls("training").build(),
        ),
        0,
    )
    assert got == [
        Bind("sv", "serve", (A(0, 0, 1),)),
        Bind("tr", "train", (A(1, 4, 5),)),
    ]


def test_class_not_admitted_by_named_partition_is_rejected() -> None:
    s = make(fenced())
    got = s.step(sub(job("x").cls("training").partition("serve").build()), 0)
    assert len(got) == 1 and isinstance(got[0], Reject)
    assert got[0].job_id == "x" and got[0].reason is Reason.FENCE
    assert s.job("x").state is JobState.REJECTED


def test_without_lending_a_full_fence_leaves_work_pending() -> None:
    c = (
        ClusterBuilder()
        .nodes("s", 1, gpus=4)
        .nodes("t", 1, gpus=4)
        .partition("serve", ["s"], admits=SERVING)
        .partition("train", ["t"], admits=TRAINING)
        .build()
    )
    s = make(c)
    got = s.step(
        sub(
            job("big").gpus(4).build(),
            job("more").gpus(2).checkpointable().build(),
        ),
        0,
    )
    assert got == [Bind("big", "train", (A(1, 4, 5, 6, 7),))]
    why = s.why_pending("more")
    assert why is not None and why.reason is Reason.NO_FIT


LEND_CASES = [
    pytest.param(
        job("b").gpus(2).checkpointable().build(),
        [Bind("b", "serve", (A(0, 0, 1),), Reason.LENT, "borrowing idle GPUs of serve", "serve")],
        id="a checkpointable job borrows idle serve GPUs up to the cap",
    ),
    pytest.param(
        job("b").gpus(2).build(),
        [],
        id="a non-checkpointable job never borrows",
    ),
    pytest.param(
        job("b").gpus(3).checkpointable().build(),
        [],
        id="a job larger than the lending cap does not borrow",
    ),
]


@pytest.mark.parametrize(("borrower", "expected"), LEND_CASES)
def test_lending_rules(borrower, expected) -> None:  # type: ignore[no-untyped-def]
    s = make(fenced(cap=2))
    first = s.step(sub(job("fill").gpus(4).build()), 0)
    assert first == [Bind("fill", "train", (A(1, 4, 5, 6, 7),))]
    assert s.step(sub(borrower), 1) == expected


def test_lending_cap_counts_all_borrowers() -> None:
    s = make(fenced(cap=2))
    got = s.step(
        sub(
            job("fill").gpus(4).build(),
            job("b1").gpus(1).checkpointable().build(),
            job("b2").gpus(1).checkpointable().build(),
            job("b3").gpus(1).checkpointable().build(),
        ),
        0,
    )
    lent = "borrowing idle GPUs of serve"
    assert got == [
        Bind("fill", "train", (A(1, 4, 5, 6, 7),)),
        Bind("b1", "serve", (A(0, 0),), Reason.LENT, lent, "serve"),
        Bind("b2", "serve", (A(0, 1),), Reason.LENT, lent, "serve"),
    ]
    assert s.ledger.lent["serve"] == 2
    assert s.job("b3").state is JobState.PENDING


def test_lending_rule_without_checkpointable_only_lends_to_anyone() -> None:
    s = make(fenced(cap=4, checkpointable_only=False))
    got = s.step(sub(job("fill").gpus(4).build(), job("b").gpus(1).build()), 0)
    assert got[1] == Bind(
        "b", "serve", (A(0, 0),), Reason.LENT, "borrowing idle GPUs of serve", "serve"
    )


def _borrowed(deadline: float = 60.0):  # type: ignore[no-untyped-def]
    s = make(fenced(cap=2, deadline=deadline))
    s.step(sub(job("fill").gpus(4).build(), job("b").gpus(2).checkpointable().build()), 0)
    assert s.ledger.allocs["b"].lent_from == "serve"
    return s


def test_owner_reclaims_lent_gpus_on_checkpoint_ack() -> None:
    s = _borrowed(deadline=60.0)
    why = "partition serve reclaims its lent GPUs for sv"
    got = flat(
        s,
        [
            (10, sub(job("sv").gpus(4).cls("serving").build())),
            (15, [Tick()]),
            (20, [CheckpointAck("b")]),
            (25, [JobStopped("b")]),
        ],
    )
    assert got == [
        Notice("b", Reason.LENT_RECLAIM, 70.0, why),
        Stop("b", Reason.LENT_RECLAIM, True, "checkpoint acknowledged"),
        Requeue("b", Reason.LENT_RECLAIM, 2, "back in its queue"),
        Bind("sv", "serve", (A(0, 0, 1, 2, 3),)),
    ]
    assert s.job("b").state is JobState.PENDING and s.job("b").attempt == 2
    assert s.ledger.lent["serve"] == 0


def test_owner_reclaims_lent_gpus_at_the_rule_deadline() -> None:
    s = _borrowed(deadline=60.0)
    got = flat(
        s,
        [
            (10, sub(job("sv").gpus(4).cls("serving").build())),
            (69, [Tick()]),
            (70, [Tick()]),
            (71, [JobStopped("b")]),
        ],
    )
    assert got == [
        Notice("b", Reason.LENT_RECLAIM, 70.0, "partition serve reclaims its lent GPUs for sv"),
        Stop("b", Reason.LENT_RECLAIM, True, "grace period expired without checkpoint ack"),
        Requeue("b", Reason.LENT_RECLAIM, 2, "back in its queue"),
        Bind("sv", "serve", (A(0, 0, 1, 2, 3),)),
    ]


def test_owner_waits_for_reclaim_and_says_so() -> None:
    s = _borrowed()
    s.step(sub(job("sv").gpus(4).cls("serving").build()), 10)
    why = s.why_pending("sv")
    assert why is not None and why.reason is Reason.WAITING_PREEMPTION
    # the notice went out once: later cycles do not repeat it
    assert s.step([Tick()], 11) == []


def test_owner_that_fits_in_its_idle_gpus_reclaims_nothing() -> None:
    s = _borrowed()
    got = s.step(sub(job("sv").gpus(2).cls("serving").build()), 10)
    assert got == [Bind("sv", "serve", (A(0, 2, 3),))]


def test_requeued_borrower_runs_again_at_home_when_home_frees() -> None:
    s = _borrowed()
    got = flat(
        s,
        [
            (10, sub(job("sv").gpus(4).cls("serving").build())),
            (20, [CheckpointAck("b")]),
            (25, [JobStopped("b")]),
            (30, [JobFinished("fill")]),
        ],
    )
    assert got[-1] == Bind("b", "train", (A(1, 4, 5),))
    assert s.job("b").attempt == 2


def test_lending_stops_while_the_owner_has_pending_work() -> None:
    """An owner whose own jobs failed to fit this cycle lends nothing."""
    s = make(fenced(cap=2))
    got = s.step(
        sub(
            job("fill").gpus(4).build(),
            job("sv1").gpus(3).cls("serving").build(),
            job("sv2").gpus(2).cls("serving").build(),
            job("b").gpus(1).checkpointable().build(),
        ),
        0,
    )
    assert got == [
        Bind("sv1", "serve", (A(0, 0, 1, 2),)),
        Bind("fill", "train", (A(1, 4, 5, 6, 7),)),
    ]


def test_reclaimed_borrower_does_not_borrow_back_what_is_being_reclaimed() -> None:
    """While the owner waits for the second borrower, the first one's freed GPU stays free."""
    s = make(fenced(cap=2))
    first = s.step(
        sub(
            job("fill").gpus(4).build(),
            job("b1").gpus(1).checkpointable().build(),
            job("b2").gpus(1).checkpointable().build(),
        ),
        0,
    )
    assert [d.job_id for d in first] == ["fill", "b1", "b2"]
    why = "partition serve reclaims its lent GPUs for sv"
    got = flat(
        s,
        [
            (10, sub(job("sv").gpus(4).cls("serving").build())),
            (20, [CheckpointAck("b1")]),
            (25, [JobStopped("b1")]),
            (30, [CheckpointAck("b2")]),
            (35, [JobStopped("b2")]),
        ],
    )
    assert got == [
        Notice("b1", Reason.LENT_RECLAIM, 70.0, why),
        Notice("b2", Reason.LENT_RECLAIM, 70.0, why),
        Stop("b1", Reason.LENT_RECLAIM, True, "checkpoint acknowledged"),
        Requeue("b1", Reason.LENT_RECLAIM, 2, "back in its queue"),
        Stop("b2", Reason.LENT_RECLAIM, True, "checkpoint acknowledged"),
        Requeue("b2", Reason.LENT_RECLAIM, 2, "back in its queue"),
        Bind("sv", "serve", (A(0, 0, 1, 2, 3),)),
    ]
