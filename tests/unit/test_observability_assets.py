"""The Prometheus rules and the Grafana dashboard shipped as package data
(``gpufence/observability``): ``promtool check rules`` and ``promtool test rules`` pass, every
alert the issue names has a firing test case, and every series the rules and the dashboard read
is a measure of ``telemetry.measures`` (or a recording rule, or dcgm-exporter's).

promtool comes from Debian's ``prometheus`` package (``.ci/run`` installs it); without it the
promtool tests skip and say so."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufence.cli.main import app
from gpufence.cli.observability_verb import observability_dir
from gpufence.telemetry.measures import MEASURES

ASSETS = observability_dir()
RULES = ASSETS / "prometheus-rules.yaml"
RULE_TESTS = ASSETS / "prometheus-rules-test.yaml"
DASHBOARD = ASSETS / "grafana-dashboard.json"
# the alerts issue 16 asks for, by what they watch
ALERTS = {
    "GpufenceServingSloBurn",  # serving SLO burn
    "GpufenceFenceSaturated",  # fence saturation
    "GpufenceQueueDelayHigh",  # queue delay p95 over a threshold
    "GpufenceServingQueueDelayHigh",
    "GpufencePreemptionBudgetSpent",  # preemptions above budget
    "GpufenceGpuHeldIdle",  # a GPU held at 0 % utilisation
    "GpufenceStrandedFragments",  # stranded fragments
    "GpufenceNodeDown",
}
_SUFFIXES = ("_bucket", "_count", "_sum")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus); .ci/run has it")
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_check_rules() -> None:
    res = _run("check", "rules", str(RULES))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_promtool_test_rules(tmp_path: Path) -> None:
    # the test file names its rule file relative to itself; run it on a copy, as a user would
    for p in (RULES, RULE_TESTS):
        shutil.copy(p, tmp_path / p.name)
    res = _run("test", "rules", str(tmp_path / RULE_TESTS.name))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_every_alert_has_a_case_that_fires() -> None:
    alerts = {r["alert"] for r in _rules() if "alert" in r}
    assert alerts == ALERTS
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        c["alertname"] for t in cases for c in t.get("alert_rule_test", []) if c.get("exp_alerts")
    }
    assert fired == ALERTS


def _names_in(expr: str) -> set[str]:
    """Metric names an expression reads (gpufence's own; DCGM's are dcgm-exporter's)."""
    return set(re.findall(r"\bgpufence[:_][A-Za-z0-9_:]+", expr))


def _known(name: str, recorded: set[str]) -> bool:
    if name in recorded or name in MEASURES:
        return True
    return any(name.endswith(s) and name.removesuffix(s) in MEASURES for s in _SUFFIXES)


def test_rules_read_only_defined_measures() -> None:
    recorded = {r["record"] for r in _rules() if "record" in r}
    for r in _rules():
        for name in _names_in(r["expr"]):
            assert _known(name, recorded), f"{r.get('alert') or r.get('record')}: {name}"


def _exprs(panels: list[dict[str, Any]]) -> list[str]:
    out = []
    for p in panels:
        out += [t["expr"] for t in p.get("targets", []) if "expr" in t]
        out += _exprs(p.get("panels", []))
    return out


def test_dashboard_is_importable_and_reads_only_defined_measures() -> None:
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["title"] and d["schemaVersion"] >= 30
    assert any(v["type"] == "datasource" for v in d["templating"]["list"])
    exprs = _exprs(d["panels"])
    assert len(exprs) >= 20
    recorded = {r["record"] for r in _rules() if "record" in r}
    used: set[str] = set()
    for e in exprs:
        for name in _names_in(e):
            assert _known(name, recorded), name
            used.add(name)
    for must in (
        "gpufence_serving_p99_seconds",
        "gpufence_serving_slo_seconds",
        "gpufence_link_utilization",
        "gpufence_partition_lent_gpus",
        "gpufence_gpu_allocated",
    ):
        assert must in used, must
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))  # Grafana keys panels by id


def test_observability_verb_lists_and_copies_the_files(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["observability", "list", "-o", "json"])
    assert res.exit_code == 0, res.output
    names = {f["name"] for f in json.loads(res.output)["files"]}
    assert names == {RULES.name, RULE_TESTS.name, DASHBOARD.name}
    res = runner.invoke(app, ["observability", "copy", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "o" / RULES.name).read_bytes() == RULES.read_bytes()
    res = runner.invoke(app, ["observability", "copy", str(tmp_path / "o")])
    assert res.exit_code != 0 and "--force" in res.output
    res = runner.invoke(app, ["observability", "path", "grafana-dashboard"])
    assert res.output.strip() == str(DASHBOARD)


def test_the_readme_metric_table_is_the_measures_table() -> None:
    """README's table under "Observation" lists every measure with its labels and meaning, in
    the order of ``telemetry.measures`` (on failure, the message is the table to paste)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    want = "\n".join(
        f"| `{m.name}` | {', '.join(m.labels) or '-'} | {m.help} |" for m in MEASURES.values()
    )
    head = "| metric | labels | meaning |\n|---|---|---|\n"
    assert head in readme
    got = readme.split(head, 1)[1].split("\n\n", 1)[0]
    assert got == want, "README.md's metric table should be:\n" + want
