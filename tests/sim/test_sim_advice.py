"""``gpufence sim`` says why a policy loses: every policy's advice in metrics.json, report.html
and the terminal; ``--strict`` refuses a cluster file with warnings; ``size`` closes with the
advice on the cluster as it is."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpufence.cli.main import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CLUSTER, SCENARIO = EXAMPLES / "mixed-64.yaml", EXAMPLES / "scenario-mixed-64.yaml"


def test_single_queue_is_told_why_it_loses_and_the_fence_is_clean(tmp_path: Path) -> None:
    args = ["sim", str(CLUSTER), str(SCENARIO), "--policy", "single-queue", "--policy", "fenced"]
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    policies = json.loads((tmp_path / "metrics.json").read_text())["policies"]
    single = {a["rule"]: a for a in policies["single-queue"]["advice"]}
    assert "serving-shares-partition" in single
    shares = single["serving-shares-partition"]
    assert set(shares) >= {"rule", "severity", "evidence", "fix"}
    assert shares["evidence"]["shares_with"] == ["training", "interactive", "batch"]
    assert "idle-interactive" in single  # one partition: no idle reclaim for notebooks
    assert policies["fenced"]["advice"] == []
    assert "advice for single-queue:" in res.output and "advice for fenced" not in res.output
    report = (tmp_path / "report.html").read_text()
    assert "Advice for single-queue" in report and "serving-shares-partition" in report
    assert "Advice for fenced</h3><p class=advice-none>" in report


def test_sim_strict_refuses_a_cluster_with_warnings(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    text = CLUSTER.read_text().replace(
        "    admits: [serving]\n", "    admits: [serving, interactive]\n", 1
    )
    bad.write_text(text)
    out = tmp_path / "out"
    args = ["sim", str(bad), str(SCENARIO), "--policy", "fenced", "--out", str(out), "--strict"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "[serving-shares-partition]" in res.output
    assert not (out / "metrics.json").exists()


def test_size_closes_with_the_advice(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["size", str(CLUSTER), str(SCENARIO), "--slo-p99-ms", "250"])
    assert res.exit_code == 0, res.output
    assert "advice on the cluster as it is: none" in res.output
    # two node failures: 16 GPUs no longer cover peak 8 + 16 of margin, and size says so
    res = CliRunner().invoke(
        app, ["size", str(CLUSTER), str(SCENARIO), "--slo-p99-ms", "250", "--failure-margin", "2"]
    )
    assert res.exit_code == 0, res.output
    assert "[serving-no-failure-margin]" in res.output
    assert "peak 8 + margin 16 = 24" in res.output
