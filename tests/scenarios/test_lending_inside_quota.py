"""Lending inside the lender's reservations and the borrower's quota (issue 33, items 4, 5).

- The free GPUs of a lender's reservation are its gang's: lending does not hand them out, also
  in a cycle in which the lender's queue was not walked (before, the gang's start slipped from
  t=1000 to the borrower's reclaim deadline, t=1600).
- GPUs borrowed from another fence are charged to the borrower's quota, and lending is gated by
  it whichever phase reaches the job (before, a queue with nominal 4 and borrowing limit 0 held
  4 GPUs at home and 7 lent ones when a job of another queue sent the walk to the lenders).
"""

from __future__ import annotations

from scenario_harness import A, JobFinished, Tick, flat, make, sub

from gpufence.model.decisions import Bind, PendingReason, Reason
from gpufence.sched.scheduler import Scheduler
from gpufence.testing.builders import ClusterBuilder, LendingRule, job

RULE = LendingRule(to=("b",), cap_gpus=8, reclaim_deadline_s=600.0)


def lender_and_borrower(**quota: int) -> Scheduler:
    """l: one 8-GPU node lending to b (cap 8); b: one 4-GPU node, queues qb (``quota``) and qo."""
    return make(
        ClusterBuilder()
        .nodes("l", 1, gpus=8)
        .nodes("bn", 1, gpus=4)
        .partition("l", ["l"], lending=(RULE,))
        .partition("b", ["bn"])
        .queue("l", "l")
        .queue("qb", "b", **quota)
        .queue("qo", "b")
        .build()
    )


def test_lending_keeps_the_gpus_of_the_lenders_reservation() -> None:
    s = lender_and_borrower()
    got = flat(
        s,
        [
            (0, sub(job("r").gpus(4).est(1000).build(), job("own").gpus(4).queue("qo").build())),
            (1, sub(job("g").gpus(8).build())),  # reserves GPUs 0-7 of l from t=1000
            # l is not walked at t=2 (nothing changed there); x must not get g's free GPUs
            (2, sub(job("x").gpus(4).queue("qb").checkpointable().build())),
        ],
    )
    assert got == [
        Bind("r", "l", (A(0, 0, 1, 2, 3),)),
        Bind("own", "b", (A(1, 8, 9, 10, 11),)),
    ]
    assert s.step([JobFinished("r")], 1000) == [Bind("g", "l", (A(0, *range(8)),))]
    assert s.why_pending("x") == PendingReason(
        Reason.NO_FIT, "partition b has 0 of 4 GPUs free; GPUs reserved from when running jobs end"
    )


def test_lent_gpus_count_against_the_borrowers_quota() -> None:
    s = lender_and_borrower(nominal_milli=4000, borrowing_limit_milli=0)
    ck = [job(f"b{i}").gpus(1).queue("qb").checkpointable().build() for i in range(12)]
    other = job("o").gpus(1).queue("qo").checkpointable().build()
    assert s.step(sub(*ck[:4]), 0) == [Bind(f"b{i}", "b", (A(1, 8 + i),)) for i in range(4)]
    # o does not fit at home, so b's queue is walked against l's idle GPUs: o borrows one, and
    # qb, at its nominal 4 with no borrowing, borrows none
    assert s.step(sub(*ck[4:], other), 1) == [
        Bind("o", "l", (A(0, 0),), Reason.LENT, "borrowing idle GPUs of l", lent_from="l")
    ]
    assert s.why_pending("b4") == PendingReason(
        Reason.QUOTA, "queue qb would use 5 GPUs: nominal 4 + borrowing limit 0"
    )
    assert s.ledger.queue_used == {"l": 0, "qb": 4000, "qo": 1000}
    assert s.step([Tick()], 2) == []  # and the answer does not depend on the walk's order


def test_a_borrower_below_its_quota_borrows_up_to_it() -> None:
    s = lender_and_borrower(nominal_milli=6000, borrowing_limit_milli=0)
    ck = [job(f"b{i}").gpus(1).queue("qb").checkpointable().build() for i in range(8)]
    got = s.step(sub(*ck), 0)
    assert [(d.job_id, d.lent_from) for d in got if isinstance(d, Bind)] == [
        ("b0", None),
        ("b1", None),
        ("b2", None),
        ("b3", None),
        ("b4", "l"),
        ("b5", "l"),
    ]
    assert s.why_pending("b6") == PendingReason(
        Reason.QUOTA, "queue qb would use 7 GPUs: nominal 6 + borrowing limit 0"
    )
