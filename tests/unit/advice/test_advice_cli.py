"""The advice where a user meets it: ``gpufence validate`` (and ``--strict``), ``gpufence up
--strict``, and the shipped examples (each either clean, or its advice explained)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufence.advice import catalog
from gpufence.advice.lint import lint_cluster
from gpufence.cli.speclint import file_inputs
from gpufence.sim.advice_run import scenario_inputs
from gpufence.sim.scenario import load_scenario
from gpufence.spec import SpecError, format_spec_error, load_cluster_with_sections

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

NEWCOMER = """\
name: my-first-cluster
node_groups:
  - {name: box, count: 2, gpus_per_node: 8, gpu_type: H100-80GB}
partitions:
  serving:
    nodes: ["box[0]"]
    admits: [serving, interactive]     # notebooks next to the model server
  training:
    nodes: ["box[1]"]
    admits: [training]
"""


def _invoke(*args: str) -> tuple[int, str]:
    """Like the ``gpufence`` entry point: a spec error is exit code 2 and its report."""
    from gpufence.cli.main import app

    res = CliRunner().invoke(app, list(args))
    if isinstance(res.exception, SpecError):
        return 2, res.output + format_spec_error(res.exception)
    return res.exit_code, res.output


def test_validate_tells_a_newcomer_why_and_how(tmp_path: Path) -> None:
    spec = tmp_path / "cluster.yaml"
    spec.write_text(NEWCOMER, encoding="utf-8")
    code, out = _invoke("validate", str(spec))
    assert code == 0, out
    assert f"warning: {spec}:7: partitions.serving.admits:" in out
    assert "[serving-shares-partition]" in out
    assert "Interactive notebooks should not sit on the serving partition" in out
    assert (
        "fix: Admit only serving in serving (admits: [serving]); give interactive a partition"
        in out
    )
    assert "+     admits: [serving]" in out and "+     reclaim: {" in out
    assert "is valid (1 advice above)" in out
    code, out = _invoke("validate", "--strict", str(spec))
    assert code == 2
    assert (
        f"error: {spec}:7: partitions.serving.admits:" in out
        and "advice: 1 error (--strict)" in out
    )


def test_control_section_can_ignore_a_rule_and_rejects_unknown_ones(tmp_path: Path) -> None:
    spec = tmp_path / "cluster.yaml"
    spec.write_text(NEWCOMER + "control:\n  advice:\n    ignore: [serving-shares-partition]\n")
    code, out = _invoke("validate", "--strict", str(spec))
    assert code == 0 and "warning" not in out, out
    spec.write_text(NEWCOMER + "control:\n  advice:\n    ignore: [serving-shares-partitions]\n")
    code, out = _invoke("validate", str(spec))
    assert code == 2
    assert "control.advice.ignore: unknown rule 'serving-shares-partitions'" in out
    assert "did you mean 'serving-shares-partition'?" in out


def test_up_strict_refuses_a_spec_with_warnings(tmp_path: Path) -> None:
    spec = tmp_path / "cluster.yaml"
    spec.write_text(NEWCOMER, encoding="utf-8")
    data = tmp_path / "data"
    code, out = _invoke(
        "up",
        "--config",
        str(spec),
        "--fake-gpus",
        "16",
        "--data",
        str(data),
        "--port",
        "0",
        "--strict",
    )
    assert code == 2, out
    assert "error:" in out and "[serving-shares-partition]" in out
    assert not (data / "gpufence.db").exists()  # refused before the control plane was built


# the shipped examples: clean, except where the advice is right and the example is kept on
# purpose (cluster-1000's unbounded borrowing: bench/sched_throughput.py's hashes depend on it)
EXPECTED = {
    "single-node-8gpu.yaml": [],
    "mixed-64.yaml": [],
    "mixed-256.yaml": [],
    "local-fenced-8gpu.yaml": [],
    "cluster-1000.yaml": [catalog.QUOTA_BORROW_UNBOUNDED, catalog.QUOTA_BORROW_UNBOUNDED],
}
SCENARIOS = {"mixed-64.yaml": "scenario-mixed-64.yaml", "mixed-256.yaml": "scenario-mixed-256.yaml"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_examples(name: str) -> None:
    path = EXAMPLES / name
    cluster, _, lines = load_cluster_with_sections(path, ("control",))
    base = None
    if name in SCENARIOS:  # with its scenario's peak, SLO window and gang sizes too
        sc, _ = load_scenario(EXAMPLES / SCENARIOS[name])
        base = scenario_inputs(sc, cluster)
    found = lint_cluster(cluster, file_inputs(path, lines, base=base))
    assert [a.rule for a in found] == EXPECTED[name], [a.summary for a in found]
