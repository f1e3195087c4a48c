"""No starvation of big gangs: the head-of-line gang holds a reservation; smaller jobs backfill
only when their estimate ends before the reservation starts; without an estimate they do not
take reserved GPUs (reason ``reserved-for-gang``)."""

from __future__ import annotations

import pytest
from scenario_harness import A, JobFinished, Tick, flat, make, sub

from gpufence.model.decisions import Bind, PendingReason, Reason
from gpufence.model.job import Job
from gpufence.sched.scheduler import Scheduler
from gpufence.testing.builders import ClusterBuilder, PreemptionMode, PreemptionPolicy, job


def one_node(gpus: int = 8, backfill: bool = True):  # type: ignore[no-untyped-def]
    return (
        ClusterBuilder().nodes("n", 1, gpus=gpus).partition("p", ["n"], backfill=backfill).build()
    )


def gang_waiting(running_est: float | None = 100.0) -> Scheduler:
    """r holds GPUs 0-5 (estimate ``running_est``); gang g (8 GPUs) waits and reserves 6-7."""
    s = make(one_node())
    r = job("r").gpus(6)
    if running_est is not None:
        r = r.est(running_est)
    got = flat(s, [(0, sub(r.build())), (1, sub(job("g").gpus(8).build()))])
    assert got == [Bind("r", "p", (A(0, 0, 1, 2, 3, 4, 5),))]
    return s


RESERVED = "GPUs reserved for gang g (starts by t=100)"

BACKFILL_CASES = [
    pytest.param(
        job("s").gpus(2).est(50).build(),
        [Bind("s", "p", (A(0, 6, 7),), Reason.BACKFILL, "ends before gang g starts at t=100")],
        None,
        id="a small job that ends before the reservation backfills",
    ),
    pytest.param(
        job("s").gpus(2).est(98).build(),
        [Bind("s", "p", (A(0, 6, 7),), Reason.BACKFILL, "ends before gang g starts at t=100")],
        None,
        id="ending exactly at the reservation start still backfills",
    ),
    pytest.param(
        job("s").gpus(2).est(99).build(),
        [],
        PendingReason(Reason.RESERVED_FOR_GANG, RESERVED),
        id="a small job that would run past the reservation waits",
    ),
    pytest.param(
        job("s").gpus(2).build(),
        [],
        PendingReason(Reason.RESERVED_FOR_GANG, RESERVED),
        id="a small job without an estimate does not backfill into reserved GPUs",
    ),
    pytest.param(
        job("s").gpus(2).priority(5).build(),
        [Bind("s", "p", (A(0, 6, 7),))],
        None,
        id="a job with higher priority than the gang takes the GPUs",
    ),
]


@pytest.mark.parametrize(("small", "expected", "why"), BACKFILL_CASES)
def test_backfill(small: Job, expected: list[Bind], why: PendingReason | None) -> None:
    s = gang_waiting()
    assert s.step(sub(small), 2) == expected
    assert s.why_pending(small.id) == why


def test_gang_reason_names_its_reservation_in_every_cycle() -> None:
    s = gang_waiting()
    expected = PendingReason(
        Reason.NO_FIT, "needs 8 free GPUs, partition p has 2 free; GPUs reserved from t=100"
    )
    assert s.why_pending("g") == expected
    assert s.step([Tick()], 2) == []
    assert s.why_pending("g") == expected  # the gang is not "reserved-for-gang" behind itself


def test_second_gang_of_the_same_shape_waits_behind_the_first() -> None:
    s = gang_waiting()
    assert s.step(sub(job("g2").gpus(8).build()), 2) == []
    assert s.why_pending("g2") == PendingReason(
        Reason.NO_FIT, "behind gang g, which holds the reservation"
    )


def test_gang_starts_when_the_running_job_ends_despite_a_stream_of_small_jobs() -> None:
    s = gang_waiting()
    small = [job(f"s{i}").gpus(1).build() for i in range(4)]
    got = flat(s, [(2, sub(*small[:2])), (50, sub(*small[2:]))])
    assert got == []
    for sj in small:
        assert s.why_pending(sj.id) == PendingReason(Reason.RESERVED_FOR_GANG, RESERVED)
    assert s.step([JobFinished("r")], 100) == [Bind("g", "p", (A(0, 0, 1, 2, 3, 4, 5, 6, 7),))]


def test_backfill_off_still_reserves_for_the_gang() -> None:
    """With backfill off the gang still holds its reservation (issue 33, item 7: before, the
    small job started at once and a stream of them kept the gang waiting for ever); only
    backfill into the reserved GPUs is off (tests/scenarios/test_reservation_rules.py)."""
    s = make(one_node(backfill=False))
    got = flat(
        s,
        [
            (0, sub(job("r").gpus(6).est(100).build())),
            (1, sub(job("g").gpus(8).build())),
            (2, sub(job("s").gpus(2).build())),
        ],
    )
    assert got == [Bind("r", "p", (A(0, 0, 1, 2, 3, 4, 5),))]
    assert s.why_pending("s") == PendingReason(Reason.RESERVED_FOR_GANG, RESERVED)


def test_unknown_running_time_reserves_at_infinity_and_blocks_backfill() -> None:
    s = gang_waiting(running_est=None)
    assert s.why_pending("g") == PendingReason(
        Reason.NO_FIT,
        "needs 8 free GPUs, partition p has 2 free; GPUs reserved from when running jobs end",
    )
    assert s.step(sub(job("s").gpus(2).est(10).build()), 2) == []
    why = s.why_pending("s")
    assert why is not None and why.reason is Reason.RESERVED_FOR_GANG


def test_small_jobs_fitting_outside_the_reservation_run() -> None:
    s = make(one_node(gpus=8))
    got = flat(
        s,
        [
            (0, sub(job("r").gpus(4).est(100).build())),
            (1, sub(job("g").gpus(6).build())),
            (2, sub(job("s").gpus(2).build())),
        ],
    )
    # g needs 6 at t=100: it holds 2 of the 4 free GPUs; s takes the other 2 unreserved
    assert got == [
        Bind("r", "p", (A(0, 0, 1, 2, 3),)),
        Bind("s", "p", (A(0, 6, 7),)),
    ]


def test_overrunning_estimate_recomputes_the_reservation() -> None:
    """r ran past its estimate: its end is unknown now, so the reservation is planned again
    without counting on it (at infinity here: nothing else will free GPUs) and no backfill
    is admitted on the old, wrong start."""
    s = gang_waiting()
    assert s.step([Tick()], 150) == []
    why = s.why_pending("g")
    assert why is not None and why.message.endswith(
        "GPUs reserved from when running jobs end: r ran past its 100 s estimate, due t=100, "
        "and holds 6 of them"
    )
    got = s.step(sub(job("s").gpus(2).est(10).build()), 151)
    assert got == []
    assert s.why_pending("s") == PendingReason(
        Reason.RESERVED_FOR_GANG,
        "GPUs reserved for gang g (starts when running jobs end: r ran past its 100 s "
        "estimate, due t=100, and holds 6 of them)",
    )


def test_estimated_job_backfills_behind_an_unestimated_one_of_the_same_shape() -> None:
    s = gang_waiting()
    got = s.step(sub(job("s0").gpus(2).build(), job("s1").gpus(2).est(10).build()), 2)
    assert got == [
        Bind("s1", "p", (A(0, 6, 7),), Reason.BACKFILL, "ends before gang g starts at t=100")
    ]
    assert s.why_pending("s0") == PendingReason(Reason.RESERVED_FOR_GANG, RESERVED)


def test_every_job_behind_the_gang_gets_a_reason() -> None:
    s = gang_waiting()
    s.step(sub(*[job(f"s{i}").gpus(1).build() for i in range(5)]), 2)
    for i in range(5):
        assert s.why_pending(f"s{i}") == PendingReason(Reason.RESERVED_FOR_GANG, RESERVED)


def _protecting_node():  # type: ignore[no-untyped-def]
    """One node of 8 GPUs in a fence that protects serving (on-demand preemption from itself,
    as the simulator's preempt-on-demand builds it): serving passes a gang's reservation."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.ON_DEMAND, from_partitions=("p",), grace_s=0.0, min_runtime_s=0.0
    )
    return ClusterBuilder().nodes("n", 1, gpus=8).partition("p", ["n"], preemption=pol).build()


PASS_CASES = [
    pytest.param(
        [(0.0, ["a", "g"]), (1.0, ["b", "sv"])],
        id="the reservation was made in an earlier cycle",
    ),
    pytest.param(
        [(0.0, ["a", "g", "b", "sv"])],
        id="the reservation was made earlier in the same walk",
    ),
]


@pytest.mark.parametrize("arrivals", PASS_CASES)
def test_serving_passing_the_reservation_leaves_no_gpu_idle_behind_it(
    arrivals: list[tuple[float, list[str]]],
) -> None:
    """a (priority 1) takes a GPU, gang g (2x4) reserves the node, b waits for g, serving sv
    passes the reservation (ending it): the partition is walked again, so g reserves again and
    b waits for it. Before, a reservation made in the same walk and ended by sv left no
    reservation and b un-walked with 6 GPUs free, until something else changed (found by
    test_guarantees_in_one_shared_partition: work conservation)."""
    jobs = {
        "a": job("a").gpus(1).priority(1).build(),
        "g": job("g").gang(2, gpus=4).build(),
        "b": job("b").gpus(1).build(),
        "sv": job("sv").gpus(1).cls("serving").build(),
    }
    s = make(_protecting_node())
    got = flat(s, [(t, sub(*(jobs[j] for j in names))) for t, names in arrivals])
    assert got == [Bind("a", "p", (A(0, 0),)), Bind("sv", "p", (A(0, 1),))]
    res = s.query.reservation("p")
    assert res is not None and res.job_id == "g"
    assert s.why_pending("b") == PendingReason(
        Reason.RESERVED_FOR_GANG, "GPUs reserved for gang g (starts when running jobs end)"
    )
    assert s.step([Tick()], 2.0) == []
