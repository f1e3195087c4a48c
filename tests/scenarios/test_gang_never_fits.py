"""A gang whose replicas can never all be placed is rejected at submit with the reason (issue
33, item 13): per-node capacity, GPU types and fences count, not only the total. Before, on an
8-GPU and a 4-GPU node, 2 replicas of 5 GPUs were accepted and waited for ever as fragmented."""

from __future__ import annotations

import pytest
from scenario_harness import A, make, sub

from gpufence.model.decisions import Bind, Reason, Reject
from gpufence.model.job import Job
from gpufence.testing.builders import ClusterBuilder, LendingRule, job


def ray_like():  # type: ignore[no-untyped-def]
    """p: an 8-GPU H100 node and a 4-GPU A100 node."""
    return (
        ClusterBuilder()
        .nodes("big", 1, gpus=8)
        .nodes("small", 1, gpus=4, gpu_type="A100-40GB")
        .partition("p", ["big", "small"])
        .build()
    )


CASES = [
    pytest.param(
        job("g").gang(2, gpus=5).build(),
        "gang of 2 replicas x 5 GPUs on one node each can never be placed: the nodes of p "
        "(GPUs per node: 8, 4) hold at most 1 such replicas",
        id="per-node capacity",
    ),
    pytest.param(
        job("g").gang(3, gpus=2).types("A100-40GB").build(),
        "gang of 3 replicas x 2 GPUs on one node each can never be placed: the nodes of p "
        "(GPUs of type A100-40GB per node: 4) hold at most 2 such replicas",
        id="GPU types",
    ),
    pytest.param(
        job("g").gpus(6).types("A100-40GB").build(),
        "gang of 1 replicas x 6 GPUs on one node each can never be placed: the nodes of p "
        "(GPUs of type A100-40GB per node: 4) hold at most 0 such replicas",
        id="one replica larger than every node of its type",
    ),
]


@pytest.mark.parametrize(("gang", "why"), CASES)
def test_a_gang_that_can_never_be_placed_is_rejected(gang: Job, why: str) -> None:
    s = make(ray_like())
    assert s.step(sub(gang), 0) == [Reject("g", Reason.NEVER_FITS, why)]


def test_a_gang_that_fits_across_nodes_is_accepted() -> None:
    s = make(ray_like())
    got = s.step(sub(job("g").gang(2, gpus=4).build()), 0)
    assert got == [Bind("g", "p", (A(0, 0, 1, 2, 3), A(0, 4, 5, 6, 7)))]


def test_a_gang_that_fits_only_in_a_lender_is_accepted() -> None:
    """Fences: a gang too big for its home may still run whole in a pool that lends to it."""
    rule = LendingRule(to=("home",), cap_gpus=8)
    c = (
        ClusterBuilder()
        .nodes("h", 1, gpus=4)
        .nodes("l", 1, gpus=8)
        .partition("home", ["h"])
        .partition("lend", ["l"], lending=(rule,))
        .build()
    )
    s = make(c)
    got = s.step(sub(job("g").gang(2, gpus=3).partition("home").checkpointable().build()), 0)
    assert [type(d).__name__ for d in got] == ["Bind"]
    # not checkpointable: the rule does not lend to it, and home has too few GPUs
    got = s.step(sub(job("n").gang(2, gpus=3).partition("home").build()), 1)
    assert got == [Reject("n", Reason.NEVER_FITS, "gang needs 6 GPUs; partition home has 4")]
    # 2 x 2 GPUs: enough GPUs at home (4) -- and per node too
    assert s.step(sub(job("m").gang(2, gpus=2).partition("home").build()), 2) == [
        Bind("m", "home", (A(0, 0, 1), A(0, 2, 3)))
    ]
