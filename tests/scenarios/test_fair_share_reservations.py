"""Reservations follow fair share (docs/architecture.md): a gang's reservation keeps the jobs
*behind* it in queue order off its GPUs, never the jobs of a queue that fair share puts ahead of
the gang's queue. Before this rule, a queue of gangs with honest estimates always held the next
reservation, falling due exactly when GPUs freed, and took ~99.8 % of the GPU time from an
equal-weight queue of 1-GPU jobs (issue 33, item 1)."""

from __future__ import annotations

from scenario_harness import A, JobFinished, flat, make, sub

from gpufence.model.decisions import Bind, PendingReason, Reason
from gpufence.sched.scheduler import Scheduler
from gpufence.testing.builders import ClusterBuilder, job


def two_queues() -> Scheduler:
    c = (
        ClusterBuilder()
        .nodes("n", 2, gpus=8)
        .partition("p", ["n"])
        .queue("a", "p")
        .queue("b", "p")
        .build()
    )
    return make(c)


def gang(i: int) -> object:
    return job(f"a{i}").gang(1, gpus=8).queue("a").est(1000).build()


def small(i: int) -> object:
    return job(f"b{i}").gpus(1).queue("b").est(100).build()


def started() -> Scheduler:
    """t=0: a1 takes node 0; t=10: b1..b8 take node 1 (b holds less than a), a2 reserves node 1
    for t=110; t=11: b9..b16 wait."""
    s = two_queues()
    got = flat(
        s,
        [
            (0, sub(gang(1))),  # type: ignore[arg-type]
            (10, sub(gang(2), *[small(i) for i in range(1, 9)])),  # type: ignore[arg-type]
            (11, sub(*[small(i) for i in range(9, 17)])),  # type: ignore[arg-type]
        ],
    )
    assert got == [
        Bind("a1", "p", (A(0, 0, 1, 2, 3, 4, 5, 6, 7),)),
        *[Bind(f"b{i}", "p", (A(1, 7 + i),)) for i in range(1, 9)],
    ]
    # no GPU is free: everything waits, a2 with its reservation on node 1
    assert s.why_pending("b9") == PendingReason(
        Reason.NO_FIT, "partition p has 0 of 16 GPUs free; gang a2 holds the reservation (by t=110)"
    )
    return s


def test_jobs_of_a_queue_below_its_share_take_the_gpus_reserved_for_a_gang_over_it() -> None:
    s = started()
    got = s.step([JobFinished(f"b{i}") for i in range(1, 9)], 110)
    # b has used 8 GPUs for 100 s, a 8 GPUs for 110 s: fair share owes b, and a2's reservation
    # does not keep b's jobs off node 1 (before the rule a2 took it, and b's jobs waited with
    # "GPUs reserved for gang a2")
    first = Bind(
        "b9", "p", (A(1, 8),), Reason.FITS, "queue b is ahead of gang a2's queue by fair share"
    )
    assert got == [first, *[Bind(f"b{i}", "p", (A(1, i - 1),)) for i in range(10, 17)]]
    assert s.why_pending("a2") == PendingReason(
        Reason.NO_FIT,
        "needs 8 free GPUs, partition p has 0 free; GPUs reserved from t=210",
    )


def test_the_gang_still_starts_once_its_queue_is_below() -> None:
    s = started()
    s.step([JobFinished(f"b{i}") for i in range(1, 9)], 110)
    # a1 ends: a holds nothing and b holds 8, so the walk tries a first, and a2 fits
    assert s.step([JobFinished("a1")], 1000) == [Bind("a2", "p", (A(0, 0, 1, 2, 3, 4, 5, 6, 7),))]
