"""A clumsy operator's arguments get one line saying what is wrong, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _gpufence(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufence", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_up_on_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "data"
    not_a_dir.write_text("x")
    out = _gpufence("up", "--fake-gpus", "1", "--port", "0", "--data", str(not_a_dir))
    assert out.returncode == 2, out
    assert f"error: {not_a_dir} is not a directory" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("verb", ["events", "queue", "history"])
def test_a_limit_past_any_list_is_a_usage_error(verb: str, tmp_path: Path) -> None:
    out = _gpufence(verb, "--limit", str(10**20), "--data", str(tmp_path))
    assert out.returncode == 2, out
    assert "Invalid value for '--limit'" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
