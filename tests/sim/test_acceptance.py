"""The simulator's acceptance scenario (two days on 256 GPUs) under the four policies.

These are model outputs, so the test asserts orderings and invariants, not magic numbers: the
fence keeps serving's SLO (>= 99.9 %) and never leaves it short of replicas while a single
queue does, every submitted job is accounted for, no invariant is ever broken, the fence's
training cost is reported, and the measures the issue asked for are there (censored delays
with counts, interconnect per link class, node-failure losses, MIG fragmentation).

(Before the latency model was exact, single-queue also *missed* the SLO here: 0.956 on seed
7. That was the model's p99(W) + p99(S) and a fabric stretch reused from CASSINI's bounds; with
the autoscaler's 40 % headroom, two replicas short for a few windows keep p99 < 300 ms.)
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


def test_the_fence_keeps_the_slo_and_never_leaves_serving_short(metrics: dict) -> None:  # type: ignore[type-arg]
    fenced = metrics["fenced"]["serving"]
    single = metrics["single-queue"]["serving"]
    assert fenced["slo_attainment"] >= 0.999
    assert fenced["services"]["chat"]["windows_short_of_replicas"] == 0
    assert single["services"]["chat"]["windows_short_of_replicas"] > 0
    for m in metrics.values():  # the worst window is the worst window, not a percentile
        assert m["serving"]["worst_window_p99_ms"] >= m["serving"]["p99_ms"]


def test_censored_delays_count_the_jobs_still_waiting(metrics: dict) -> None:  # type: ignore[type-arg]
    for name, m in metrics.items():
        started = m["queue_delay_s"]["all"]
        everyone = m["queue_delay_all_s"]["all"]
        pending = m["states"].get("pending", 0)
        assert everyone["censored"] == pending, name
        assert everyone["n"] == started["n"] + pending, name
        assert everyone["p99"] >= started["p99"] or pending == 0, name


def test_losses_links_and_mig_fragmentation_are_measured(metrics: dict) -> None:  # type: ignore[type-arg]
    fenced = metrics["fenced"]
    assert fenced["gpu"]["fragmentation_by_partition"]["interactive"] > 0  # MIG: computed, not 0
    assert any(
        m["preemptions"]["gpu_hours_lost_by_cause"].get("node_failure", 0) > 0
        for m in metrics.values()
    )
    for m in metrics.values():
        assert set(m["interconnect"]) == {"nvlink", "node_uplink", "rack_uplink"}
        for s in m["interconnect"].values():
            assert 0 <= s["p50"] <= s["p95"] <= s["max"] <= 1
    # multi-node gangs run all-reduce over their node uplinks
    assert fenced["interconnect"]["node_uplink"]["max"] > 0


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
