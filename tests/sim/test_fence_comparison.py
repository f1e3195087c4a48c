"""Issue 33, item 12: the README's comparison shows what the fence is for. On
``scenario-mixed-256-surge.yaml`` (the two-day acceptance scenario with serving demand tripling
for an hour in the night, inside the serving fence's size, while training holds every other GPU)
a single fair-share queue leaves serving short of replicas and misses its SLO; the fence holds
it; the fence that lends its idle GPUs holds it while lending."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufence.cli.main import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("surge")
    surge = EXAMPLES / "scenario-mixed-256-surge.yaml"
    args = ["sim", str(EXAMPLES / "mixed-256.yaml"), str(surge)]
    for p in ("single-queue", "fenced", "fenced-lend"):
        args += ["--policy", p]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text())["policies"]  # type: ignore[no-any-return]


@pytest.mark.slow  # three two-day runs (~1.5 min)
def test_a_single_queue_misses_the_slo_the_fence_holds(metrics: dict[str, Any]) -> None:
    single = metrics["single-queue"]["serving"]
    assert single["slo_attainment"] < 0.999
    assert single["services"]["chat"]["windows_short_of_replicas"] > 0
    for name in ("fenced", "fenced-lend"):
        assert metrics[name]["serving"]["slo_attainment"] >= 0.999, name
    assert metrics["fenced"]["serving"]["services"]["chat"]["windows_short_of_replicas"] == 0


@pytest.mark.slow
def test_the_lending_fence_lends_and_the_plain_one_does_not(metrics: dict[str, Any]) -> None:
    assert metrics["fenced"]["lending"] == {"binds": 0, "gpu_hours": 0.0}
    lent = metrics["fenced-lend"]["lending"]
    assert lent["binds"] > 0 and lent["gpu_hours"] > 0
