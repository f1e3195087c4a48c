"""The fenced demo act's fences come from the machine (issue 13, item 7): a valid spec for 1,
2, 4, 8 and 16 GPUs (real or fake), every GPU in exactly one fence."""

from __future__ import annotations

import sys

import pytest

from gpufence.control.base.config import cluster_from_spec_dict
from gpufence.control.gpus.discovery import fake_gpus
from gpufence.demo.live import _job, fence_layout, fenced_spec
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


def test_demo_jobs_run_under_the_interpreter_gpufence_runs_under() -> None:
    """Issue 33, item 9: the jobs ran ``python`` from PATH, so ``.venv/bin/gpufence demo``
    without an activated venv completed 0 of 66 jobs."""
    req = _job("train", "1")
    assert req.command[:3] == [sys.executable, "-m", "gpufence.demo.programs"]
