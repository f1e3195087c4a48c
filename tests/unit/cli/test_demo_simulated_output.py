"""``gpufence demo --simulated`` prints counts in words, never Python's reprs of its dicts
(``{<JobState.DONE: 'done'>: 55}``: issue 32, case 10). The real CLI, the real simulator."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from gpufence.cli.main import app

pytest.importorskip("matplotlib", reason="the sim extra is not installed")


def test_simulated_demo_prints_no_python_reprs() -> None:
    r = CliRunner().invoke(app, ["demo", "--simulated"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "<JobState" not in r.output and "<Reason" not in r.output, r.output
    assert not re.search(r"\{['<]", r.output), r.output  # no dict repr
    assert re.search(r"states: done=\d+", r.output), r.output
    assert re.search(r"reclaims\s+│ \d+ \([a-z-]+=\d+", r.output), r.output
