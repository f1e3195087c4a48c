"""Same inputs and seed -> byte-identical metrics.json; another seed -> a different run."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufence.cli.main import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(out: Path, seed: int) -> bytes:
    args = [
        "sim",
        str(EXAMPLES / "mixed-64.yaml"),
        str(EXAMPLES / "scenario-mixed-64.yaml"),
        "--policy",
        "fenced",
        "--policy",
        "fenced-lend",
        "--out",
        str(out),
        "--seed",
        str(seed),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return (out / "metrics.json").read_bytes()


@pytest.mark.slow  # two sims of mixed-64 each (~10 s)
def test_same_seed_gives_byte_identical_metrics(tmp_path: Path) -> None:
    assert _run(tmp_path / "a", 3) == _run(tmp_path / "b", 3)


@pytest.mark.slow
def test_another_seed_gives_another_run(tmp_path: Path) -> None:
    assert _run(tmp_path / "a", 3) != _run(tmp_path / "c", 4)
