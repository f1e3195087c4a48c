"""``sim`` / ``size`` / ``validate`` given the wrong file: one line naming the file and what it
looks like, exit 2, never the parsed YAML."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufence.cli.examples_verb import examples_dir
from gpufence.cli.main import app

EX = examples_dir()
FIX = Path(__file__).resolve().parents[2] / "fixtures"
CLUSTER = str(EX / "mixed-64.yaml")
SCENARIO = str(EX / "scenario-mixed-64.yaml")
DLRM = str(FIX / "dlrm_sample.csv")
OPENB = str(FIX / "openb" / "pods.csv")

CASES: list[tuple[str, list[str], str]] = [
    (
        "sim swapped",
        ["sim", SCENARIO, CLUSTER, "-p", "fenced"],
        f"CLUSTER '{SCENARIO}' is a scenario (it has horizon_s, services, training), not a "
        f"cluster spec (a YAML file with node_groups and partitions): gpufence sim CLUSTER.yaml "
        f"WORKLOAD; the arguments look swapped: gpufence sim {CLUSTER} {SCENARIO}",
    ),
    (
        "sim trace as cluster",
        ["sim", DLRM, CLUSTER, "-p", "fenced"],
        f"CLUSTER '{DLRM}' is a dlrm trace, not a cluster spec",
    ),
    (
        "sim openb pods as cluster",
        ["sim", OPENB, SCENARIO, "-p", "fenced"],
        f"CLUSTER '{OPENB}' is a openb trace, not a cluster spec",
    ),
    (
        "sim cluster twice",
        ["sim", CLUSTER, CLUSTER, "-p", "fenced"],
        f"WORKLOAD '{CLUSTER}' is a cluster spec (it has node_groups, fabric, partitions), not a "
        "scenario YAML or a trace file",
    ),
    (
        "size swapped",
        ["size", SCENARIO, CLUSTER, "--slo-p99-ms", "300"],
        f"CLUSTER '{SCENARIO}' is a scenario",
    ),
    (
        "size with a trace",
        ["size", CLUSTER, DLRM, "--slo-p99-ms", "300"],
        f"WORKLOAD '{DLRM}' is a dlrm trace: gpufence size sizes a serving fence from a scenario",
    ),
    ("validate a scenario", ["validate", SCENARIO], f"CLUSTER '{SCENARIO}' is a scenario"),
]


@pytest.mark.parametrize(("argv", "line"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_mixed_up_arguments_get_one_line(argv: list[str], line: str) -> None:
    r = CliRunner().invoke(app, argv, env={"COLUMNS": "400"})
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: "), r.output
    assert line in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output  # one line, no YAML dump
    assert "node_groups': [" not in r.output and "Traceback" not in r.output


def test_a_csv_of_no_known_format(tmp_path: Path) -> None:
    csv = tmp_path / "costs.csv"
    csv.write_text("node,price,owner,zone,rack\na,1,b,c,d\n")
    r = CliRunner().invoke(app, ["sim", str(csv), SCENARIO, "-p", "fenced"], env={"COLUMNS": "400"})
    assert r.exit_code == 2
    assert "is a CSV file (first row: node, price, owner, zone, …), not a cluster spec" in r.output


def test_a_broken_cluster_still_gets_its_field_errors(tmp_path: Path) -> None:
    """A YAML mapping of neither kind goes to the loader, which names the fields."""
    bad = tmp_path / "c.yaml"
    bad.write_text("name: x\nnode_group: []\n")
    argv = [sys.executable, "-m", "gpufence", "sim", str(bad), SCENARIO, "-p", "fenced"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "node_groups: required field is missing" in r.stderr
