"""Time-slicing: up to ``time_slice_max`` jobs per GPU, spread to the least-shared GPUs, with the
co-location recorded by ``Ledger.colocated``."""

from __future__ import annotations

import pytest
from scenario_harness import A, JobFinished, flat, make, sub

from gpufence.model.decisions import Bind, PendingReason, Reason, Reject
from gpufence.testing.builders import ClusterBuilder, SharingMode, job


def ts_cluster(max_jobs: int = 2, gpus: int = 2, nodes: int = 1):  # type: ignore[no-untyped-def]
    return (
        ClusterBuilder()
        .nodes("n", nodes, gpus=gpus)
        .partition("ts", ["n"], sharing=SharingMode.TIME_SLICE, time_slice_max=max_jobs)
        .build()
    )


def sliced(node: int, *gpus: int) -> A:  # type: ignore[valid-type]
    return A(node, *gpus, time_sliced=True)


@pytest.mark.parametrize(
    ("max_jobs", "bound"),
    [
        pytest.param(1, 2, id="time_slice_max 1 is one job per GPU"),
        pytest.param(2, 4, id="time_slice_max 2 doubles the slots"),
        pytest.param(3, 6, id="time_slice_max 3 triples the slots"),
    ],
)
def test_up_to_time_slice_max_jobs_per_gpu(max_jobs: int, bound: int) -> None:
    s = make(ts_cluster(max_jobs=max_jobs))
    got = s.step(sub(*[job(f"j{i}").gpus(1).build() for i in range(7)]), 0)
    # least-shared GPU first: the jobs alternate between GPU 0 and GPU 1
    assert got == [Bind(f"j{i}", "ts", (sliced(0, i % 2),)) for i in range(bound)]
    assert s.why_pending(f"j{bound}") == PendingReason(
        Reason.NO_FIT, "no node in ts has 1 GPU slots free"
    )


def test_colocation_is_recorded_per_gpu() -> None:
    s = make(ts_cluster(max_jobs=3))
    s.step(sub(*[job(f"j{i}").gpus(1).build() for i in range(5)]), 0)
    assert s.ledger.colocated(0) == ("j0", "j2", "j4")
    assert s.ledger.colocated(1) == ("j1", "j3")


def test_finished_job_leaves_the_colocation_and_frees_its_slot() -> None:
    s = make(ts_cluster(max_jobs=2))
    got = flat(
        s,
        [
            (0, sub(*[job(f"j{i}").gpus(1).build() for i in range(5)])),
            (5, [JobFinished("j2")]),
        ],
    )
    assert got[-1] == Bind("j4", "ts", (sliced(0, 0),))
    assert s.ledger.colocated(0) == ("j0", "j4")


def test_multi_gpu_job_takes_one_slot_on_each_of_its_gpus() -> None:
    s = make(ts_cluster(max_jobs=2, gpus=4))
    got = s.step(
        sub(job("one").gpus(1).build(), job("two").gpus(2).build(), job("four").gpus(4).build()),
        0,
    )
    assert got == [
        Bind("one", "ts", (sliced(0, 0),)),
        Bind("two", "ts", (sliced(0, 1, 2),)),
        Bind("four", "ts", (sliced(0, 3, 0, 1, 2),)),
    ]
    assert s.ledger.colocated(0) == ("one", "four")
    assert s.ledger.colocated(3) == ("four",)


def test_time_sliced_gang_spreads_to_the_least_loaded_node() -> None:
    s = make(ts_cluster(max_jobs=2, gpus=1, nodes=2))
    got = s.step(sub(job("a").gpus(1).build(), job("g").gang(2, 1).build()), 0)
    assert got == [
        Bind("a", "ts", (sliced(0, 0),)),
        Bind("g", "ts", (sliced(1, 1), sliced(0, 0))),
    ]
    assert s.ledger.colocated(0) == ("a", "g")


def test_a_gang_bigger_than_all_slots_is_rejected() -> None:
    s = make(ts_cluster(max_jobs=2, gpus=2))
    assert s.step(sub(job("g").gang(5, 1).build()), 0) == [
        Reject("g", Reason.NEVER_FITS, "gang needs 5 GPUs; partition ts has 2")
    ]
