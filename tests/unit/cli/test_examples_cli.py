"""``gpufence examples list|path|copy``: the examples shipped in the package."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpufence.cli.examples_verb import examples_dir
from gpufence.cli.main import app

REPO_EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_list_path_copy(tmp_path: Path) -> None:
    runner = CliRunner()
    doc = json.loads(runner.invoke(app, ["examples", "list", "-o", "json"]).stdout)
    names = {e["name"]: e for e in doc["examples"]}
    assert {"mixed-64.yaml", "scenario-mixed-64.yaml", "single-node-8gpu.yaml"} <= set(names)
    assert names["mixed-64.yaml"]["kind"] == "cluster"
    assert names["scenario-mixed-64.yaml"]["kind"] == "scenario"
    assert names["mixed-64.yaml"]["about"].startswith("64 H100-80GB GPUs")
    assert Path(doc["dir"]) == examples_dir()
    # the repo's examples/ is the package's directory (a link)
    assert REPO_EXAMPLES.resolve() == examples_dir().resolve()
    r = runner.invoke(app, ["examples", "path", "mixed-64"])
    assert r.exit_code == 0 and Path(r.stdout.strip()) == examples_dir() / "mixed-64.yaml"
    r = runner.invoke(app, ["examples", "path", "nope"])
    assert r.exit_code == 2 and "no example 'nope' (known: " in r.output
    dest = tmp_path / "ex"
    r = runner.invoke(app, ["examples", "copy", str(dest)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in dest.iterdir()) == sorted(names)
    assert (dest / "mixed-64.yaml").read_text() == (examples_dir() / "mixed-64.yaml").read_text()
    r = runner.invoke(app, ["examples", "copy", str(dest)])
    assert r.exit_code == 2 and "--force" in r.output
    assert runner.invoke(app, ["examples", "copy", str(dest), "--force"]).exit_code == 0
    r = runner.invoke(app, ["validate", str(dest / "mixed-64.yaml")])
    assert r.exit_code == 0, r.output
