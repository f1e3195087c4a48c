"""``gpufence demo`` tells one story (``demo/story.py``) in both tellings: the simulated demo here
(seconds); the live one, with real processes on fake GPUs, is a slow test."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpufence.cli.main import app
from gpufence.demo.story import STORY


def _told(args: list[str]) -> str:
    result = CliRunner().invoke(app, ["demo", *args])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())  # tables and wrapping aside


def _assert_story(output: str) -> None:
    at = -1
    for act in STORY:
        assert " ".join(act.shows.split()) in output, act.shows  # told as it starts
        start = output.find(act.heading, at + 1)
        assert start > at, f"{act.heading!r} missing or out of order"
        at = start


def test_the_simulated_demo_tells_the_story() -> None:
    _assert_story(_told(["--simulated"]))


@pytest.mark.slow  # 66 real jobs, then the serving surge with real processes (~1 min)
def test_the_live_demo_tells_the_same_story() -> None:
    _assert_story(_told(["--fake-gpus", "8"]))
