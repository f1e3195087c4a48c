"""Gates: held jobs, dependencies (after-ok / after-any / after-not-ok) and array caps decide
exactly which pending jobs may be placed, with the pending reason each one shows."""

from __future__ import annotations

import pytest
from scenario_harness import A, JobCancelled, JobFinished, make, sub

from gpufence.model.decisions import Bind, Cancel, Decision, PendingReason, Reason
from gpufence.model.events import Event, JobHeld, JobReleased, OutcomeKnown, Tick
from gpufence.model.job import Job
from gpufence.model.job import WorkloadClass as W
from gpufence.sched.jobs import JobState
from gpufence.sched.scheduler import Scheduler
from gpufence.testing.builders import ClusterBuilder, job


def cluster():  # type: ignore[no-untyped-def]
    """One partition, 2 nodes x 4 GPUs."""
    return (
        ClusterBuilder()
        .nodes("n", 2, gpus=4)
        .partition("train", ["n"], admits=frozenset({W.TRAINING, W.BATCH}))
        .build()
    )


def binds(ds: list[Decision]) -> list[str]:
    return [d.job_id for d in ds if isinstance(d, Bind)]


def cancels(ds: list[Decision]) -> list[tuple[str, str]]:
    return [(d.job_id, d.message) for d in ds if isinstance(d, Cancel)]


def step(s: Scheduler, t: float, *events: Event) -> list[Decision]:
    return s.step(list(events), t)


def one(jid: str) -> Job:
    return job(jid).gpus(1).build()


# (parent's end, kind, does the dependent bind?, its cancel message if not)
DEPENDENCY_CASES = [
    pytest.param(True, "after-ok", True, None, id="after-ok parent done"),
    pytest.param(
        False, "after-ok", False, "dependency can never be met: p failed", id="after-ok failed"
    ),
    pytest.param(True, "after-any", True, None, id="after-any parent done"),
    pytest.param(False, "after-any", True, None, id="after-any parent failed"),
    pytest.param(False, "after-not-ok", True, None, id="after-not-ok parent failed"),
    pytest.param(
        True,
        "after-not-ok",
        False,
        "dependency can never be met: p done (after-not-ok)",
        id="after-not-ok parent done",
    ),
]


@pytest.mark.parametrize(("succeeded", "kind", "runs", "message"), DEPENDENCY_CASES)
def test_dependency_waits_then_runs_or_is_cancelled(
    succeeded: bool, kind: str, runs: bool, message: str | None
) -> None:
    s = make(cluster())
    d0 = step(s, 0, *sub(one("p"), job("c").gpus(1).after(kind, "p").build()))
    assert binds(d0) == ["p"]
    want = {"after-ok": "to succeed", "after-any": "to end", "after-not-ok": "to fail"}[kind]
    assert s.why_pending("c") == PendingReason(Reason.DEPENDENCY, f"waiting for p {want}")
    assert binds(step(s, 10, Tick())) == []  # nothing else frees it
    d1 = step(s, 20, JobFinished("p", succeeded))
    if runs:
        assert binds(d1) == ["c"] and cancels(d1) == []
    else:
        assert binds(d1) == [] and cancels(d1) == [("c", message)]
        assert s.job("c").state is JobState.CANCELLED
        assert all(d.reason is Reason.DEPENDENCY for d in d1 if isinstance(d, Cancel))


def test_after_ok_chain_cancels_down_the_chain_in_one_step() -> None:
    s = make(cluster())
    step(
        s,
        0,
        *sub(
            one("a"),
            job("b").gpus(1).after("after-ok", "a").build(),
            job("c").gpus(1).after("after-ok", "b").build(),
        ),
    )
    assert s.why_pending("c") == PendingReason(Reason.DEPENDENCY, "waiting for b to succeed")
    d = step(s, 5, JobFinished("a", False))
    assert cancels(d) == [
        ("b", "dependency can never be met: a failed"),
        ("c", "dependency can never be met: b cancelled"),
    ]


def test_waits_for_every_parent() -> None:
    s = make(cluster())
    step(s, 0, *sub(one("a"), one("b"), job("c").gpus(1).after("after-ok", "a", "b").build()))
    assert binds(step(s, 1, JobFinished("a"))) == []
    assert s.why_pending("c") == PendingReason(Reason.DEPENDENCY, "waiting for b to succeed")
    assert binds(step(s, 2, JobFinished("b"))) == ["c"]


def test_unknown_parent_and_known_outcome() -> None:
    s = make(cluster())
    d = step(
        s,
        0,
        OutcomeKnown("old", "done"),
        OutcomeKnown("bad", "failed"),
        *sub(
            job("x").gpus(1).after("after-ok", "ghost").build(),
            job("y").gpus(1).after("after-ok", "old").build(),
            job("z").gpus(1).after("after-ok", "bad").build(),
        ),
    )
    assert cancels(d) == [
        ("x", "dependency can never be met: ghost is unknown"),
        ("z", "dependency can never be met: bad failed"),
    ]
    assert binds(d) == ["y"]


def test_hold_and_release() -> None:
    s = make(cluster())
    d = step(s, 0, *sub(job("h").gpus(1).held().build(), job("big").gang(2, gpus=4).build()))
    assert binds(d) == ["big"]
    assert s.why_pending("h") == PendingReason(Reason.HELD, "held; release it to let it run")
    d = step(s, 1, JobFinished("big"))
    assert binds(d) == []  # GPUs free, but it is held
    d = step(s, 2, JobReleased("h"))
    assert binds(d) == ["h"]


def test_hold_takes_a_queued_job_out_and_cancel_of_a_held_job() -> None:
    s = make(cluster())
    step(s, 0, *sub(job("big").gang(2, gpus=4).build(), one("q"), one("r")))
    assert s.why_pending("q") is not None and s.why_pending("q").reason is not Reason.HELD  # type: ignore[union-attr]
    step(s, 1, JobHeld("q"))
    assert s.why_pending("q") == PendingReason(Reason.HELD, "held; release it to let it run")
    assert binds(step(s, 2, JobFinished("big"))) == ["r"]
    step(s, 3, JobCancelled("q"))
    assert s.job("q").state is JobState.CANCELLED
    assert binds(step(s, 4, JobReleased("q"))) == []


def test_array_cap_releases_tasks_by_index_as_slots_free() -> None:
    s = make(cluster())
    tasks = [job(f"t{i}").gpus(1).array("t0", cap=2).build() for i in range(5)]
    d = step(s, 0, *sub(*tasks))
    assert binds(d) == ["t0", "t1"]  # 8 GPUs free, the cap lets two run
    msg = "array t0 runs at most 2 task(s) at once (2 already do)"
    assert s.why_pending("t2") == PendingReason(Reason.ARRAY_LIMIT, msg)
    assert binds(step(s, 1, JobFinished("t1"))) == ["t2"]
    assert binds(step(s, 2, JobFinished("t0", False))) == ["t3"]  # a failed task frees a slot
    assert binds(step(s, 3, JobCancelled("t4"))) == []
    assert binds(step(s, 4, JobFinished("t2"), JobFinished("t3"))) == []


def test_array_cap_counts_queued_tasks_that_do_not_fit() -> None:
    s = make(cluster())
    d = step(s, 0, *sub(job("wall").gpus(4).build(), job("wall2").gpus(4).build()))
    assert binds(d) == ["wall", "wall2"]
    tasks = [job(f"a{i}").gpus(2).array("a0", cap=2).build() for i in range(3)]
    step(s, 1, *sub(*tasks))
    # a0 and a1 are queued (no room); a2 waits on the cap, not on capacity
    assert s.why_pending("a2") is not None and s.why_pending("a2").reason is Reason.ARRAY_LIMIT  # type: ignore[union-attr]
    assert s.why_pending("a0").reason is not Reason.ARRAY_LIMIT  # type: ignore[union-attr]
    d = step(s, 2, JobFinished("wall"))
    assert binds(d) == ["a0", "a1"]


def test_uncapped_array_and_restored_tasks() -> None:
    s = make(cluster())
    from gpufence.model.events import JobRestored

    running = job("r0").gpus(1).array("r0", cap=1).build()
    d = step(
        s,
        0,
        JobRestored(running, "train", (A(0, 0),)),
        *sub(job("r1").gpus(1).array("r0", cap=1).build()),
    )
    assert binds(d) == []  # the restored task holds the only slot
    assert binds(step(s, 1, JobFinished("r0"))) == ["r1"]


def test_a_held_dependent_is_cancelled_when_its_dependency_fails() -> None:
    s = make(cluster())
    step(s, 0, *sub(one("p"), job("h").gpus(1).held().after("after-ok", "p").build()))
    assert s.why_pending("h") == PendingReason(Reason.HELD, "held; release it to let it run")
    d = step(s, 1, JobFinished("p", False))
    assert cancels(d) == [("h", "dependency can never be met: p failed")]
