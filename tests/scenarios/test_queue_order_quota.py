"""Queue order inside a partition (priority, then weighted fair share with decayed usage) and
cohort quota admission (nominal quota, borrowing limit, lending limit, as in Kueue)."""

from __future__ import annotations

import math

import pytest
from scenario_harness import A, JobFinished, flat, make, sub

from gpufence.model.decisions import Bind, Reason, Reject
from gpufence.model.events import UsageRestored
from gpufence.model.job import Job
from gpufence.testing.builders import ClusterBuilder, job


def two_queues(gpus: int = 4, **queue_kw: dict[str, object]):  # type: ignore[no-untyped-def]
    b = ClusterBuilder().nodes("n", 1, gpus=gpus).partition("p", ["n"])
    for q in ("qa", "qb"):
        b = b.queue(q, "p", **queue_kw.get(q, {}))
    return b.build()


def ones(prefix: str, queue: str, n: int, **kw: int) -> list[Job]:
    out = []
    for i in range(n):
        b = job(f"{prefix}{i}").gpus(1).queue(queue)
        if "priority" in kw:
            b = b.priority(kw["priority"])
        out.append(b.build())
    return out


ORDER_CASES = [
    pytest.param(
        {},
        [*ones("a", "qa", 4), *ones("b", "qb", 4)],
        ["a0", "b0", "a1", "b1"],
        id="equal weights interleave the queues",
    ),
    pytest.param(
        {"qa": {"weight": 3.0}},
        [*ones("a", "qa", 4), *ones("b", "qb", 4)],
        ["a0", "b0", "a1", "a2"],
        id="weight 3 to 1 gives the heavier queue three GPUs of four",
    ),
    pytest.param(
        {},
        [*ones("a", "qa", 4), *ones("b", "qb", 2, priority=5)],
        ["b0", "b1", "a0", "a1"],
        id="priority beats fair share and submission order",
    ),
]


@pytest.mark.parametrize(("queues", "jobs", "bound"), ORDER_CASES)
def test_queue_order(queues, jobs, bound) -> None:  # type: ignore[no-untyped-def]
    s = make(two_queues(**queues))
    got = s.step(sub(*jobs), 0)
    assert got == [Bind(j, "p", (A(0, g),)) for g, j in enumerate(bound)]


def test_decayed_usage_puts_the_heavy_user_behind() -> None:
    s = make(two_queues(), fair_share_half_life_s=3600.0)
    got = flat(
        s,
        [
            (0, sub(job("old").gpus(4).queue("qa").build())),
            (3600, [JobFinished("old")]),
            # qa submits first, but qb has used nothing
            (3600, sub(job("x").gpus(4).queue("qa").build(), job("y").gpus(4).queue("qb").build())),
        ],
    )
    assert got == [
        Bind("old", "p", (A(0, 0, 1, 2, 3),)),
        Bind("y", "p", (A(0, 0, 1, 2, 3),)),
    ]
    ranked = s.fair_share("p")
    # after y started, qb holds 4 GPUs and ranks behind qa's decayed 2.885 GPU-h
    assert [(t.queue, t.rank) for t in ranked] == [("qa", 1), ("qb", 2)]
    qa = next(t for t in ranked if t.queue == "qa")
    qb = next(t for t in ranked if t.queue == "qb")
    expected_gpu_h = 4 * 1 / math.log(2) * 0.5  # integral of 4 GPUs over one half-life
    assert qa.decayed_usage_gpu_h == pytest.approx(expected_gpu_h)
    assert qa.holding_gpus == 0 and qb.holding_gpus == 4
    # in GPUs, like holding_gpus beside it (issue 32: not milli-GPUs)
    assert qa.share == pytest.approx(expected_gpu_h)
    assert qb.share == pytest.approx(4)
    assert (qa.rank, qb.rank) == (1, 2)
    assert "lowest weighted share" in qa.explanation
    assert qb.explanation.startswith("behind qa")


def test_usage_decays_by_half_each_half_life() -> None:
    s = make(two_queues(), fair_share_half_life_s=100.0)
    s.step(sub(job("a").gpus(1).queue("qa").build()), 0)
    s.step([JobFinished("a")], 100)
    u1 = s.fair_share("p")[1].decayed_usage_gpu_h
    s.step([], 200)
    u2 = next(t for t in s.fair_share("p") if t.queue == "qa").decayed_usage_gpu_h
    assert u2 == pytest.approx(u1 / 2)


def test_fair_share_of_idle_partition_explains_every_queue() -> None:
    s = make(two_queues())
    s.step([], 0)
    ranked = s.fair_share("p")
    assert [(t.queue, t.tenant, t.weight, t.share, t.rank) for t in ranked] == [
        ("qa", "qa", 1.0, 0.0, 1),
        ("qb", "qb", 1.0, 0.0, 2),
    ]


QUOTA_CASES = [
    pytest.param(
        {"qa": {"nominal_milli": 2000}, "qb": {"nominal_milli": 2000}},
        4,
        None,
        id="a queue borrows the unused nominal quota of its cohort",
    ),
    pytest.param(
        {
            "qa": {"nominal_milli": 2000, "borrowing_limit_milli": 1000},
            "qb": {"nominal_milli": 2000},
        },
        3,
        "queue qa would use 4 GPUs: nominal 2 + borrowing limit 1",
        id="the borrowing limit caps what a queue takes beyond nominal",
    ),
    pytest.param(
        {"qa": {"nominal_milli": 2000}, "qb": {"nominal_milli": 2000, "lending_limit_milli": 1000}},
        3,
        "queue qa is at its nominal quota (2 GPUs) and the cohort of p has 0 GPUs to lend",
        id="the lending limit caps what the cohort lends",
    ),
    pytest.param(
        {"qa": {"nominal_milli": 2000, "borrowing_limit_milli": 0}, "qb": {}},
        2,
        "queue qa would use 3 GPUs: nominal 2 + borrowing limit 0",
        id="borrowing limit zero pins a queue to its nominal quota",
    ),
]


@pytest.mark.parametrize(("queues", "runs", "why"), QUOTA_CASES)
def test_quota_admission(queues, runs, why) -> None:  # type: ignore[no-untyped-def]
    s = make(two_queues(gpus=8, **queues))
    got = s.step(sub(*ones("a", "qa", 4)), 0)
    assert got == [Bind(f"a{i}", "p", (A(0, i),)) for i in range(runs)]
    pending = s.why_pending(f"a{runs}") if runs < 4 else None
    if why is None:
        assert pending is None
    else:
        assert pending is not None
        assert (pending.reason, pending.message) == (Reason.QUOTA, why)


def test_quota_frees_when_the_queue_finishes_work() -> None:
    s = make(two_queues(gpus=8, qa={"nominal_milli": 1000, "borrowing_limit_milli": 0}))
    got = flat(s, [(0, sub(*ones("a", "qa", 2))), (5, [JobFinished("a0")])])
    assert got == [Bind("a0", "p", (A(0, 0),)), Bind("a1", "p", (A(0, 0),))]


def test_quota_blocked_queue_does_not_block_other_queues() -> None:
    s = make(two_queues(gpus=8, qa={"nominal_milli": 1000, "borrowing_limit_milli": 0}))
    got = s.step(sub(*ones("a", "qa", 3), *ones("b", "qb", 2)), 0)
    assert got == [
        Bind("a0", "p", (A(0, 0),)),
        Bind("b0", "p", (A(0, 1),)),
        Bind("b1", "p", (A(0, 2),)),
    ]
    why = s.why_pending("a2")
    assert why is not None and why.reason is Reason.QUOTA


def test_job_larger_than_nominal_plus_borrowing_is_rejected() -> None:
    s = make(two_queues(gpus=8, qa={"nominal_milli": 2000, "borrowing_limit_milli": 1000}))
    got = s.step(sub(job("big").gpus(4).queue("qa").build()), 0)
    assert got == [Reject("big", Reason.NEVER_FITS, "needs 4 GPUs but queue qa may hold at most 3")]


def test_quota_reason_says_would_exceed_when_the_queue_is_below_nominal() -> None:
    # qb borrowed qa's unused quota; a 4-GPU job of qa (using nothing) would exceed nominal 2
    s = make(two_queues(gpus=8, qa={"nominal_milli": 2000}, qb={"nominal_milli": 2000}))
    s.step(sub(*ones("b", "qb", 4)), 0)
    s.step(sub(job("big").gpus(4).queue("qa").build()), 1)
    why = s.why_pending("big")
    assert why is not None and why.reason is Reason.QUOTA
    assert why.message == (
        "queue qa would exceed its nominal quota of 2 GPUs (uses 0, the job needs 4) and the "
        "cohort of p has 0 GPUs to lend"
    )


def test_restored_usage_ranks_like_the_history_it_came_from() -> None:
    """A front end that restarts hands the saved usage back (UsageRestored): the tenant that
    used the GPUs stays behind, as if the scheduler had never stopped."""
    hist = make(two_queues(), fair_share_half_life_s=3600.0)
    flat(hist, [(0, sub(job("old").gpus(4).queue("qa").build())), (3600, [JobFinished("old")])])
    saved = hist.fair_share_usage()
    assert saved["qa"] > 0 and saved["qb"] == 0

    fresh = make(two_queues(), fair_share_half_life_s=3600.0)
    ev = UsageRestored((*sorted(saved.items()), ("gone", 1e9), ("qb", -5.0)), at=3600.0)
    got = fresh.step(
        [ev, *sub(job("x").gpus(4).queue("qa").build(), job("y").gpus(4).queue("qb").build())],
        7200,
    )
    assert [d.job_id for d in got if isinstance(d, Bind)] == ["y"]  # qa still pays its history
    # one half-life later the restored usage has halved; the unknown queue and the negative
    # value were ignored
    assert fresh.fair_share_usage()["qa"] == pytest.approx(saved["qa"] / 2)
    assert fresh.fair_share_usage()["qb"] == 0
    assert "gone" not in fresh.fair_share_usage()
