"""Gang placement: all-or-nothing replicas x GPUs, topology first (one NVLink domain, then one
node, then one rack, then the fewest racks); small jobs best-fit so whole nodes stay whole."""

from __future__ import annotations

import pytest
from scenario_harness import A, JobFinished, JobStopped, NodeDown, flat, make, sub

from gpufence.model.decisions import Bind, Reason, Requeue, Stop
from gpufence.model.events import JobLost
from gpufence.model.job import Job
from gpufence.testing.builders import ClusterBuilder, job


def racks(nodes_per_rack: tuple[int, ...] = (2, 2), nvlink: tuple[int, ...] = (4, 4)):  # type: ignore[no-untyped-def]
    """Racks r0, r1, ... with 8-GPU nodes (two NVLink domains of 4 by default).

    Node i holds GPUs 8i..8i+7; nodes are numbered rack by rack."""
    b = ClusterBuilder()
    groups = []
    for r, n in enumerate(nodes_per_rack):
        b = b.nodes(f"g{r}", n, gpus=8, rack=f"r{r}", nvlink=nvlink)
        groups.append(f"g{r}")
    return b.partition("p", groups).build()


def gpus(node: int, *local: int) -> tuple[int, ...]:
    return tuple(8 * node + i for i in local)


def an(node: int, *local: int) -> A:  # type: ignore[valid-type]
    return A(node, *gpus(node, *local))


PLACE_CASES = [
    pytest.param(
        [],
        job("j").gpus(4).build(),
        (an(0, 0, 1, 2, 3),),
        id="four GPUs stay inside one NVLink domain",
    ),
    pytest.param(
        [job("f").gpus(1).build()],
        job("j").gpus(4).build(),
        (an(0, 4, 5, 6, 7),),
        id="a domain with a GPU taken is skipped for a 4-GPU replica",
    ),
    pytest.param(
        [job("f").gpus(2).build()],
        job("j").gpus(2).build(),
        (an(0, 2, 3),),
        id="a small job best-fits the fullest node and the tightest domain",
    ),
    pytest.param(
        [],
        job("j").gang(2, 4).build(),
        (an(0, 0, 1, 2, 3), an(0, 4, 5, 6, 7)),
        id="a gang that fits one node stays on one node",
    ),
    pytest.param(
        [],
        job("j").gang(2, 8).build(),
        (an(0, 0, 1, 2, 3, 4, 5, 6, 7), an(1, 0, 1, 2, 3, 4, 5, 6, 7)),
        id="a two-node gang stays in one rack",
    ),
    pytest.param(
        [job("f").gpus(8).build()],
        job("j").gang(2, 8).build(),
        (an(2, 0, 1, 2, 3, 4, 5, 6, 7), an(3, 0, 1, 2, 3, 4, 5, 6, 7)),
        id="a gang moves to the rack that can hold it whole",
    ),
    pytest.param(
        [],
        job("j").gang(3, 8).build(),
        (
            an(0, 0, 1, 2, 3, 4, 5, 6, 7),
            an(1, 0, 1, 2, 3, 4, 5, 6, 7),
            an(2, 0, 1, 2, 3, 4, 5, 6, 7),
        ),
        id="a gang larger than any rack spans the fewest racks",
    ),
]


@pytest.mark.parametrize(("before", "gang", "expected"), PLACE_CASES)
def test_topology_placement(before: list[Job], gang: Job, expected: tuple[A, ...]) -> None:  # type: ignore[valid-type]
    s = make(racks())
    first = s.step(sub(*before), 0)
    assert [d.job_id for d in first] == [j.id for j in before]
    assert s.step(sub(gang), 1) == [Bind(gang.id, "p", expected)]


def test_tightest_single_rack_wins() -> None:
    """r0 has room for 3 replicas, r1 for exactly 2: a 2-replica gang goes to r1."""
    s = make(racks(nodes_per_rack=(3, 2)))
    got = s.step(sub(job("j").gang(2, 8).build()), 0)
    assert got == [Bind("j", "p", (an(3, 0, 1, 2, 3, 4, 5, 6, 7), an(4, 0, 1, 2, 3, 4, 5, 6, 7)))]


def test_fewest_racks_prefers_the_biggest_racks() -> None:
    s = make(racks(nodes_per_rack=(1, 3, 1)))
    got = s.step(sub(job("j").gang(4, 8).build()), 0)
    # r1 (nodes 1-3) plus one more rack: r0 comes first among equals
    assert [a.node for a in got[0].assignments] == [1, 2, 3, 0]  # type: ignore[union-attr]


def test_replicas_spread_over_partial_nodes_fewest_nodes_first() -> None:
    s = make(racks(nodes_per_rack=(2,)))
    got = flat(
        s,
        [
            (0, sub(job("f0").gpus(4).build(), job("f1").gpus(6).build())),
            (1, sub(job("j").gang(3, 2).build())),
        ],
    )
    # node 0 has 4 free (room for 2 replicas), node 1 has 2 free (room for 1)
    assert got == [
        Bind("f0", "p", (an(0, 0, 1, 2, 3),)),
        Bind("f1", "p", (an(1, 0, 1, 2, 3, 4, 5),)),
        Bind("j", "p", (an(0, 4, 5), an(0, 6, 7), an(1, 6, 7))),
    ]


def test_gang_is_all_or_nothing() -> None:
    s = make(racks(nodes_per_rack=(2,)))
    got = s.step(sub(job("f").gpus(1).build(), job("j").gang(2, 8).build()), 0)
    assert got == [Bind("f", "p", (an(0, 0),))]
    assert s.ledger.allocs.keys() == {"f"}
    why = s.why_pending("j")
    assert why is not None and why.reason is Reason.NO_FIT


def test_free_gpus_on_different_nodes_but_no_replica_fits_is_fragmented() -> None:
    s = make(racks(nodes_per_rack=(2,)))
    got = s.step(sub(job("f0").gpus(6).build(), job("f1").gpus(6).build()), 0)
    assert [d.job_id for d in got] == ["f0", "f1"]
    s.step(sub(job("j").gpus(4).build()), 1)
    why = s.why_pending("j")
    assert why is not None
    assert (why.reason, why.message) == (
        Reason.FRAGMENTED,
        "4 GPUs free in p but not 1 x 4 on usable nodes; GPUs reserved from when running jobs end",
    )


def test_waiting_gang_starts_when_enough_gpus_free() -> None:
    s = make(racks(nodes_per_rack=(2,)))
    got = flat(
        s,
        [
            (0, sub(job("f").gpus(8).build(), job("j").gang(2, 8).build())),
            (10, [JobFinished("f")]),
        ],
    )
    assert got == [
        Bind("f", "p", (an(0, 0, 1, 2, 3, 4, 5, 6, 7),)),
        Bind("j", "p", (an(0, 0, 1, 2, 3, 4, 5, 6, 7), an(1, 0, 1, 2, 3, 4, 5, 6, 7))),
    ]


def test_node_down_stops_and_requeues_its_gang() -> None:
    s = make(racks(nodes_per_rack=(3,)))
    got = flat(
        s,
        [
            (0, sub(job("j").gang(2, 8).build())),
            (5, [NodeDown("g0-0")]),
            (6, [JobStopped("j")]),
        ],
    )
    assert got == [
        Bind("j", "p", (an(0, 0, 1, 2, 3, 4, 5, 6, 7), an(1, 0, 1, 2, 3, 4, 5, 6, 7))),
        Stop("j", Reason.NODE_FAILURE, True, "node g0-0 failed"),
        Requeue("j", Reason.NODE_FAILURE, 2, "back in its queue"),
        Bind("j", "p", (an(1, 0, 1, 2, 3, 4, 5, 6, 7), an(2, 0, 1, 2, 3, 4, 5, 6, 7))),
    ]


def test_a_lost_gang_is_stopped_and_requeued_at_once() -> None:
    """``JobLost`` (a member's launcher died: the job's outcome unknown) ends the attempt and
    requeues the job as the next one, its GPUs free in the same cycle (nothing is left to
    stop). (Like every exit, a front end sends it only for the attempt that runs.)"""
    s = make(racks(nodes_per_rack=(3,)))
    got = flat(
        s,
        [
            (0, sub(job("j").gang(2, 8).build(), job("w").gpus(8).build())),
            (5, [JobLost("j", "attempt 1 lost")]),
        ],
    )
    assert got == [
        Bind("j", "p", (an(0, 0, 1, 2, 3, 4, 5, 6, 7), an(1, 0, 1, 2, 3, 4, 5, 6, 7))),
        Bind("w", "p", (an(2, 0, 1, 2, 3, 4, 5, 6, 7),)),
        Stop("j", Reason.LOST, True, "attempt 1 lost"),
        Requeue("j", Reason.LOST, 2, "back in its queue"),
        Bind("j", "p", (an(0, 0, 1, 2, 3, 4, 5, 6, 7), an(1, 0, 1, 2, 3, 4, 5, 6, 7))),
    ]


def _small_and_big_racks():  # type: ignore[no-untyped-def]
    """r0: four 4-GPU nodes (GPUs 0-15, nodes 0-3); r1: three 8-GPU nodes (GPUs 16-39, 4-6).
    r0 is the tighter rack for a 16-GPU gang, but the gang would span all four of its nodes
    where r1 holds it on two."""
    return (
        ClusterBuilder()
        .nodes("s", 4, gpus=4, rack="r0")
        .nodes("b", 3, gpus=8, rack="r1")
        .partition("p", ["s", "b"])
        .build()
    )


@pytest.mark.parametrize(
    ("gang", "expected"),
    [
        pytest.param(
            job("g").gang(16, gpus=1).build(),
            tuple(A(4, 16 + i) for i in range(8)) + tuple(A(5, 24 + i) for i in range(8)),
            id="16 x 1",
        ),
        pytest.param(
            job("g").gang(4, gpus=4).build(),
            (
                A(4, 16, 17, 18, 19),
                A(4, 20, 21, 22, 23),
                A(5, 24, 25, 26, 27),
                A(5, 28, 29, 30, 31),
            ),
            id="4 x 4",
        ),
    ],
)
def test_a_gang_of_small_replicas_spans_the_fewest_nodes(
    gang: Job, expected: tuple[A, ...]
) -> None:  # type: ignore[valid-type]
    s = make(_small_and_big_racks())
    assert s.step(sub(gang), 0) == [Bind("g", "p", expected)]
