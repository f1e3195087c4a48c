"""``gpufence size`` never answers a fence that fails its own validation (issue 33, item 8):
replicas do not span nodes (3-GPU replicas on 8-GPU nodes strand 2 GPUs per node), and an
autoscaler that keeps fewer replicas at peak than the SLO needs is named, exit non-zero."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gpufence.cli.main import app
from gpufence.sim.sizing import pack_nodes

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CLUSTER, SCENARIO = EXAMPLES / "mixed-64.yaml", EXAMPLES / "scenario-mixed-64.yaml"


def test_replicas_are_packed_whole_onto_nodes() -> None:
    assert pack_nodes([3] * 18, 8) == 9  # 2 per node; GPUs alone said ceil(54 / 8) = 7
    assert pack_nodes([3] * 16, 8) == 8
    assert pack_nodes([8, 4, 4, 2, 2], 8) == 3
    assert pack_nodes([], 8) == 0


def test_an_autoscaler_below_the_slo_is_refused_with_the_fix(tmp_path: Path) -> None:
    text = SCENARIO.read_text()
    assert "target_utilization" in text
    lines = [
        (ln.split("target_utilization")[0] + "target_utilization: 0.95")
        if "target_utilization" in ln
        else ln
        for ln in text.splitlines()
    ]
    sc = tmp_path / "scenario.yaml"
    sc.write_text("\n".join(lines) + "\n")
    res = CliRunner().invoke(app, ["size", str(CLUSTER), str(sc), "--slo-p99-ms", "250"])
    # (main() prints a ValueError as "error: ..." and exits 2)
    assert isinstance(res.exception, ValueError), res.output
    assert str(res.exception) == (
        "services[0].target_utilization 0.95: at the peak the autoscaler keeps 7 replicas, and "
        "the SLO needs 8; no fence size can meet it -- set target_utilization to at most 0.82"
    )
