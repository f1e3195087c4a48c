"""``queue_order: las``: least attained service first (Tiresias-style, discretised levels).

A job's attained service is the GPU-seconds of its earlier attempts; a job back from a node
failure (or a preemption) with hours of service waits behind fresh jobs, where the default order
(priority, fair share, submit time) would run it first because it was submitted first."""

from __future__ import annotations

import pytest
from scenario_harness import A, JobStopped, NodeDown, NodeUp, flat, make, run, sub

from gpufence.model.decisions import Bind, Reason, Requeue, Stop
from gpufence.sched.las import service_level
from gpufence.testing.builders import ClusterBuilder, job


def cluster(order: str):  # type: ignore[no-untyped-def]
    return (
        ClusterBuilder().nodes("t", 1, gpus=4).partition("train", ["t"], queue_order=order).build()
    )


def _after_failure(order: str, *late: object) -> list[object]:
    """``a`` runs 2 h on the node, the node fails, ``a`` is requeued with 8 GPU-hours of
    service; ``b`` (and ``late``) waited all along; then the node comes back."""
    s = make(cluster(order))
    steps = [
        (0.0, sub(job("a").gpus(4).build())),
        (10.0, sub(job("b").gpus(4).at(10.0).build(), *late)),  # type: ignore[arg-type]
        (7200.0, [NodeDown("t-0")]),
        (7202.0, [JobStopped("a")]),
    ]
    run(s, steps)
    return s.step([NodeUp("t-0")], 7300.0)


def test_las_runs_the_job_with_least_attained_service_first() -> None:
    assert _after_failure("las") == [Bind("b", "train", (A(0, 0, 1, 2, 3),))]


def test_default_order_runs_the_earliest_submitted_first() -> None:
    assert _after_failure("fair-share") == [Bind("a", "train", (A(0, 0, 1, 2, 3),))]


def test_las_keeps_priority_first() -> None:
    urgent = job("c").gpus(4).priority(1).at(10.0).build()
    got = _after_failure("las", urgent)
    assert got == [Bind("c", "train", (A(0, 0, 1, 2, 3),))]


def test_las_breaks_ties_within_a_level_by_submit_time() -> None:
    # a ran only 10 s on 4 GPUs (40 GPU-s): still level 0 with b, so a (submitted first) goes
    s = make(cluster("las"))
    got = flat(
        s,
        [
            (0.0, sub(job("a").gpus(4).build())),
            (5.0, sub(job("b").gpus(4).at(5.0).build())),
            (10.0, [NodeDown("t-0")]),
            (11.0, [JobStopped("a")]),
            (20.0, [NodeUp("t-0")]),
        ],
    )
    assert got == [
        Bind("a", "train", (A(0, 0, 1, 2, 3),)),
        Stop("a", Reason.NODE_FAILURE, True, "node t-0 failed"),
        Requeue("a", Reason.NODE_FAILURE, 2, "back in its queue"),
        Bind("a", "train", (A(0, 0, 1, 2, 3),)),
    ]
    assert s.job("a").service_gpu_s == pytest.approx(44.0)


@pytest.mark.parametrize(
    ("gpu_s", "level"),
    [(0.0, 0), (3599.0, 0), (3600.0, 1), (4 * 3600.0 - 1, 1), (4 * 3600.0, 2), (1e12, 15)],
)
def test_service_levels(gpu_s: float, level: int) -> None:
    assert service_level(gpu_s) == level
