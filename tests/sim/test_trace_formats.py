"""``gpufence sim CLUSTER TRACE``: every trace format through the CLI, named or detected.

Each fixture in tests/fixtures replays on mixed-64 with ``--format`` and without it (detected by
its columns): both runs give the same metrics, with every job the loader keeps submitted. A file
no format recognises ends with one line naming the file and the formats. The HTML report's plots
are left out here (they are most of a small run's time; the sim acceptance test draws them).
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import gpufence.sim.report
from gpufence.cli.main import app, main
from gpufence.sim.workloads.trace_formats import FORMATS, TraceFormatError, detect, load_trace
from gpufence.spec import load_cluster

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
CLUSTER = ROOT / "examples" / "mixed-64.yaml"
# format -> (fixture, jobs submitted: what the loader keeps; None for request traces)
TRACES: dict[str, tuple[Path, int | None]] = {
    "philly": (FIX / "philly_cluster_job_log_sample.json", 3),
    "pai": (FIX / "pai_task_table_sample.csv", 5),
    "tiresias": (ROOT / "tests" / "golden" / "tiresias_60_job.csv", 60),
    "dlrm": (FIX / "dlrm_sample.csv", 9),
    "openb": (FIX / "openb" / "pods.csv", 13),
    "azure-llm": (FIX / "azure_llm_code_head.csv", None),
    "sd": (FIX / "sd_lora_requests_sample.csv", None),
}


@pytest.fixture(autouse=True)
def no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpufence.sim.report, "render", lambda *a, **k: "<html></html>")


def sim(out: Path, trace: Path, *extra: str) -> tuple[dict[str, Any], str]:
    args = ["sim", str(CLUSTER), str(trace), "--policy", "fenced", "--out", str(out), *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text()), result.output


def test_every_format_has_a_fixture() -> None:
    assert set(TRACES) == set(FORMATS)


@pytest.mark.parametrize("fmt", list(TRACES))
def test_a_trace_replays_the_same_named_or_detected(tmp_path: Path, fmt: str) -> None:
    trace, jobs = TRACES[fmt]
    named, output = sim(tmp_path / "named", trace, "--format", fmt)
    detected, _ = sim(tmp_path / "detected", trace)
    assert named == detected
    assert f"{fmt} " in output  # the line that says what was read
    m = named["policies"]["fenced"]
    assert m["invariant_violations"] == 0
    if jobs is not None:
        assert m["submitted"] == jobs
        assert m["serving"]["services"] == {}
    else:  # a request-rate curve: one autoscaled service in the serving fence
        (svc,) = m["serving"]["services"].values()
        assert m["submitted"] >= 1 and svc["slo_ms"] > 0
        if fmt == "sd":  # the azure fixture is six requests in its first second
            assert svc["peak_replicas_wanted"] >= 1


def test_a_gzipped_trace_is_detected_and_read_too(tmp_path: Path) -> None:
    cluster = load_cluster(CLUSTER)
    for fmt, (trace, _) in TRACES.items():
        gz = tmp_path / f"{trace.name}.gz"
        gz.write_bytes(gzip.compress(trace.read_bytes()))
        if fmt == "pai":  # the job table travels with the task table
            jobs = FIX / "pai_job_table_sample.csv"
            (tmp_path / f"{jobs.name}.gz").write_bytes(gzip.compress(jobs.read_bytes()))
        assert detect(gz) == fmt, gz
        plain, packed = load_trace(trace, fmt, cluster), load_trace(gz, fmt, cluster)
        assert (packed.horizon_s, packed.work) == (plain.horizon_s, plain.work), fmt


def test_pai_from_either_table_and_a_missing_job_table(tmp_path: Path) -> None:
    from_tasks, _ = sim(tmp_path / "t", FIX / "pai_task_table_sample.csv")
    from_jobs, _ = sim(tmp_path / "j", FIX / "pai_job_table_sample.csv")
    assert from_tasks["policies"] == from_jobs["policies"]
    alone = tmp_path / "pai_task_table_alone.csv"
    shutil.copy(FIX / "pai_task_table_sample.csv", alone)
    result = CliRunner().invoke(app, ["sim", str(CLUSTER), str(alone), "--policy", "fenced"])
    assert result.exit_code != 0 and "pai_job_table_alone.csv" in str(result.exception)


def test_the_slo_of_a_request_trace_can_be_set(tmp_path: Path) -> None:
    trace, _ = TRACES["azure-llm"]
    m, output = sim(tmp_path, trace, "--slo-p99-ms", "2500")
    (svc,) = m["policies"]["fenced"]["serving"]["services"].values()
    assert svc["slo_ms"] == 2500.0 and "p99 SLO 2,500 ms" in output


def test_an_unknown_file_is_one_line_naming_it_and_the_formats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = FIX / "openb" / "nodes.csv"  # an openb node list: a cluster, not a workload
    with pytest.raises(TraceFormatError):
        detect(nodes)
    monkeypatch.setattr(sys, "argv", ["gpufence", "sim", str(CLUSTER), str(nodes), "-p", "fenced"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert str(nodes) in err and all(f in err for f in FORMATS)


def test_a_scenario_yaml_stays_the_default_whatever_its_name(tmp_path: Path) -> None:
    scenario = (ROOT / "examples" / "scenario-mixed-64.yaml").read_text()
    other = tmp_path / "day.scenario"
    other.write_text(
        scenario.replace("cluster: mixed-64.yaml", f"cluster: {CLUSTER}").replace(
            "horizon_s: 86400", "horizon_s: 3600"
        )
    )
    m, _ = sim(tmp_path / "out", other)
    assert m["scenario"] == "mixed-64-one-day" and m["horizon_s"] == 3600
