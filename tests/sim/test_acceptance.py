"""The simulator's acceptance scenario (two days on 256 GPUs) under the four policies.

These are model outputs, so the test asserts orderings and invariants, not magic numbers:
single-queue misses the serving SLO clearly more than fenced, fenced keeps >= 99.9 %, every
submitted job is accounted for, no invariant is ever broken, and the fence's training cost is
reported.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufence.cli.main import app

pytestmark = pytest.mark.slow  # two simulated days on 256 GPUs, four policies (~70 s)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ACCOUNTED = {
    "done",
    "running",
    "pending",
    "cancelled",
    "reclaimed",
    "rejected",
    "failed",
    "stopping",
}


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    out = tmp_path_factory.mktemp("sim")
    args = ["sim", str(EXAMPLES / "mixed-256.yaml"), str(EXAMPLES / "scenario-mixed-256.yaml")]
    for p in ("single-queue", "preempt-on-demand", "fenced", "fenced-lend"):
        args += ["--policy", p]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "report.html").stat().st_size > 10_000
    data = json.loads((out / "metrics.json").read_text())
    return data["policies"]  # type: ignore[no-any-return]


def test_single_queue_misses_the_slo_that_the_fence_keeps(metrics: dict) -> None:  # type: ignore[type-arg]
    fenced = metrics["fenced"]["serving"]["slo_attainment"]
    single = metrics["single-queue"]["serving"]["slo_attainment"]
    assert fenced >= 0.999
    assert single < fenced - 0.01


def test_every_policy_keeps_invariants_and_accounts_for_every_job(metrics: dict) -> None:  # type: ignore[type-arg]
    for name, m in metrics.items():
        assert m["invariant_violations"] == 0, name
        assert set(m["states"]) <= ACCOUNTED, name
        assert sum(m["states"].values()) == m["submitted"], name


def test_schema_and_training_cost_are_reported(metrics: dict) -> None:  # type: ignore[type-arg]
    for m in metrics.values():
        for key in (
            "submitted",
            "completed",
            "rejected",
            "queue_delay_s",
            "jct_s",
            "serving",
            "gpu",
            "preemptions",
            "reclaims",
            "invariant_violations",
        ):
            assert key in m
        assert {"p50", "p95", "p99", "max"} <= set(m["queue_delay_s"]["training"])
        assert {"p99_ms", "slo_ms", "slo_attainment"} <= set(m["serving"])
        assert {"utilization", "allocation_ratio", "fragmentation"} <= set(m["gpu"])
        assert {"count", "gpu_hours_lost", "by_reason"} <= set(m["preemptions"])
        assert {"count", "gpu_hours_returned"} <= set(m["reclaims"])
    # fencing serving off costs training capacity: its tail wait is longer than with lending
    assert (
        metrics["fenced"]["gpu"]["allocation_ratio"]
        < metrics["fenced-lend"]["gpu"]["allocation_ratio"]
    )
