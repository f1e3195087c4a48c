"""The fenced demo act's fences come from the machine (issue 13, item 7): a valid spec for 1,
2, 4, 8 and 16 GPUs (real or fake), every GPU in exactly one fence; and its cast from the fences
(issue 33, item 9): the gang fits the training fence and the surge finds both fences full."""

from __future__ import annotations

import sys

import pytest

from gpufence.control.base.config import cluster_from_spec_dict
from gpufence.control.gpus.discovery import fake_gpus
from gpufence.demo.fences import cast, fence_layout, fenced_spec
from gpufence.demo.live import _job, seed_job_s
from gpufence.model.partition import PreemptionMode


@pytest.mark.parametrize(
    ("n", "fences"),
    [
        (1, {"shared": [0]}),
        (2, {"serving": [0], "training": [1]}),
        (4, {"serving": [0], "training": [1, 2], "interactive": [3]}),
        (8, {"serving": [0, 1], "training": [2, 3, 4, 5], "interactive": [6, 7]}),
        (
            16,
            {
                "serving": [0, 1, 2, 3],
                "training": list(range(4, 12)),
                "interactive": [12, 13, 14, 15],
            },
        ),
    ],
)
def test_fences_are_derived_from_the_gpus_of_the_machine(
    n: int, fences: dict[str, list[int]]
) -> None:
    cluster = cluster_from_spec_dict(fenced_spec(fake_gpus(n)))
    assert {p: list(g) for p, g in cluster.partition_gpus.items()} == fences
    assert fence_layout(list(range(n))) == fences
    if "serving" in fences:  # serving may take GPUs back from training in an incident
        pol = cluster.partitions["serving"].preemption
        assert pol.mode is PreemptionMode.INCIDENT_ONLY and pol.from_partitions == ("training",)
    # every fence that admits notebooks reclaims idle ones
    assert all(
        p.reclaim is not None for p in cluster.partitions.values() if "interactive" in p.admits
    )


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16, 24])
def test_the_cast_fills_both_fences_so_the_surge_must_preempt_the_gang(n: int) -> None:
    """With a 4-GPU gang on 4 GPUs the gang was rejected (the training fence holds 2); on 16
    the surge found idle training GPUs and nobody was preempted."""
    layout = fence_layout(list(range(n)))
    c = cast(layout)
    assert c.preempts and not c.missing
    assert c.base_replicas == len(layout["serving"])  # the serving fence is full
    assert c.gang_replicas * c.gang_gpus == len(layout["training"])  # so is the training fence
    assert 1 <= c.surge_replicas <= len(layout["training"])  # the preempted gang makes room


def test_on_one_gpu_the_act_says_what_the_preemption_needs() -> None:
    c = cast(fence_layout([0]))
    assert not c.preempts and c.surge_replicas == 0
    assert c.base_seconds is not None  # serving leaves the one GPU to the gang
    assert c.missing == (
        "a serving fence beside a training fence: 2 GPUs or more; this machine has 1"
    )


@pytest.mark.parametrize(("n", "seconds"), [(1, 0.25), (2, 0.25), (4, 0.5), (8, 1.0), (16, 1.0)])
def test_act_one_takes_about_as_long_on_few_gpus(n: int, seconds: float) -> None:
    assert seed_job_s(n) == seconds


def test_demo_jobs_run_under_the_interpreter_gpufence_runs_under() -> None:
    """Issue 33, item 9: the jobs ran ``python`` from PATH, so ``.venv/bin/gpufence demo``
    without an activated venv completed 0 of 66 jobs."""
    req = _job("train", "1")
    assert req.command[:3] == [sys.executable, "-m", "gpufence.demo.programs"]
