"""What ``gpufence sim`` writes: events.csv, several seeds with intervals, the per-link timeline,
the openb replay's table, and the report's verdict sentences."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufence.cli.main import app
from gpufence.sim.report import verdict

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FIXTURES = ROOT / "tests" / "fixtures"


def short_scenario(tmp_path: Path, hours: float = 30.0) -> Path:
    """mixed-64's scenario cut to a horizon past 100,000 s (the old events.csv bug's edge)."""
    sc = yaml.safe_load((EXAMPLES / "scenario-mixed-64.yaml").read_text())
    sc["horizon_s"] = hours * 3600
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("seeds")
    out = tmp / "out"
    args = ["sim", str(EXAMPLES / "mixed-64.yaml"), str(short_scenario(tmp)), "--policy", "fenced"]
    res = CliRunner().invoke(app, [*args, "--out", str(out), "--seeds", "1..2", "--link-timeline"])
    assert res.exit_code == 0, res.output
    return out


def test_events_csv_decision_column_never_repeats_the_time(two_seeds: Path) -> None:
    with open(two_seeds / "events.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows
    assert any(float(r["time_s"]) >= 100_000 for r in rows)
    assert any(float(r["time_s"]) < 100_000 for r in rows)
    for r in rows:
        assert r["decision"].split(" ")[0].isalpha(), r  # "Bind job_id=...", never "  512.000 Bind"


def test_several_seeds_give_means_and_intervals(two_seeds: Path) -> None:
    m = json.loads((two_seeds / "metrics.json").read_text())
    assert m["seeds"] == [1, 2]
    assert set(m["by_seed"]) == {"1", "2"}
    iv = m["intervals"]["fenced"]["serving.slo_attainment"]
    assert iv["n"] == 2 and iv["ci95_low"] <= iv["mean"] <= iv["ci95_high"]
    per_seed = [m["by_seed"][s]["fenced"]["completed"] for s in ("1", "2")]
    assert m["intervals"]["fenced"]["completed"]["mean"] == pytest.approx(sum(per_seed) / 2)
    html = (two_seeds / "report.html").read_text()
    assert "95 % interval" in html and 'id="joint-fenced"' in html


def test_the_link_timeline_lists_every_busy_link(two_seeds: Path) -> None:
    with open(two_seeds / "links.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and {r["link_class"] for r in rows} <= {"nvlink", "node_uplink", "rack_uplink"}
    assert all(0 < float(r["utilization"]) <= 1 for r in rows)


def test_openb_replay_shows_pending_and_rejected_pods(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app,
        [
            "sim",
            str(EXAMPLES / "mixed-64.yaml"),
            str(FIXTURES / "openb" / "pods.csv"),
            "--policy",
            "fenced",
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "pending" in res.output and "rejected" in res.output
    m = json.loads((tmp_path / "metrics.json").read_text())["policies"]["fenced"]
    assert m["pending_at_end"] == m["states"].get("pending", 0)
    assert m["queue_delay_all_s"]["all"]["censored"] == m["pending_at_end"]


def _metrics(att: float, worst: float | None, p99: float | None) -> dict[str, Any]:
    return {
        "serving": {
            "slo_attainment": att,
            "slo_ms": 300.0,
            "p99_ms": p99,
            "worst_window_p99_ms": worst,
            "requests_within_slo": 0.991,
            "services": {"chat": {}},
        },
        "queue_delay_s": {"training": {"p50": 60.0, "p99": 7200.0, "n": 90}},
        "queue_delay_all_s": {"training": {"p50": 60.0, "p99": 36000.0, "n": 100, "censored": 10}},
        "preemptions": {
            "count": 2,
            "gpu_hours_lost": 3.5,
            "gpu_hours_lost_by_cause": {"node_failure": 3.0, "preemption": 0.5},
            "by_reason": {"incident-preemption": 2},
        },
        "reclaims": {"count": 0, "gpu_hours_returned": 0.0},
        "gpu": {"allocation_ratio": 0.8, "utilization": 0.7, "fragmentation": 0.05},
        "interconnect": {"node_uplink": {"p50": 0.0, "p95": 0.3, "max": 0.9}},
        "invariant_violations": 0,
    }


def test_verdict_says_met_for_what_was_met_and_names_the_worst_window() -> None:
    v = verdict("single-queue", _metrics(0.9563, 471.0, 280.0))
    assert "met its p99 SLO (300 ms) in windows carrying 95.63% of requests" in v
    assert "4.37% of requests fell in windows whose p99 exceeded it" in v
    assert "worst window p99 471 ms" in v
    assert "missed" not in v
    assert "counting the 10 still waiting at the horizon, p99 is at least 10.0 h" in v
    assert "node failure: 3.0" in v


def test_verdict_for_a_kept_slo_and_an_overloaded_window() -> None:
    assert "kept its p99 within the SLO" in verdict("fenced", _metrics(1.0, 210.0, 190.0))
    v = verdict("x", _metrics(0.5, None, None))
    assert "no steady state" in v and "unbounded" in v


def _at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        assert isinstance(obj, dict) and part in obj, f"{path}: no {part!r} in metrics.json"
        obj = obj[part]
    return obj


def test_metrics_json_holds_every_measure_the_control_plane_shares_with_it(
    two_seeds: Path,
) -> None:
    """One definition (telemetry.measures): each measure with a ``sim`` path is in each policy's
    metrics.json object under that path, so /metrics and metrics.json name the same things."""
    from gpufence.telemetry.measures import MEASURES

    shared = {m.name: m.sim for m in MEASURES.values() if m.sim is not None}
    assert len(shared) >= 10
    m = json.loads((two_seeds / "metrics.json").read_text())
    for seed in ("1", "2"):
        policy = m["by_seed"][seed]["fenced"]
        for name, path in shared.items():
            assert _at(policy, path) is not None, name
    # the label values agree too: classes of the queue delay, outcomes of the finished jobs
    from gpufence.control.metrics import OUTCOMES
    from gpufence.model.job import WorkloadClass

    policy = m["by_seed"]["1"]["fenced"]
    assert set(policy["queue_delay_s"]) == {str(c) for c in WorkloadClass} | {"all"}
    ended = set(policy["states"]) - {"pending", "running", "starting", "stopping"}
    assert ended and ended <= set(OUTCOMES)
