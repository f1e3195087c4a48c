"""``gpufence demo`` tells one story (``demo/story.py``) in both tellings: the simulated demo here
(seconds); the live one, with real processes on fake GPUs, is a slow test."""

from __future__ import annotations

import re

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


@pytest.mark.slow  # 66 real jobs, then the serving surge with real processes (~40 s each)
@pytest.mark.parametrize("gpus", [1, 2, 4, 8, 16])
def test_the_live_demo_tells_the_same_story(gpus: int) -> None:
    """On any number of GPUs (issue 33, item 9: with 4 the act-2 gang was rejected, with 16
    nobody was preempted, both exit 1; with 1 a serving replica that ended before the clean-up
    made it raise CancelError). Exit 0 means every act's verdict was ok."""
    told = _told(["--fake-gpus", str(gpus)])
    _assert_story(told)
    # ... and ends with the web dashboard that showed act 2 (tests/integration/test_demo_keep.py)
    last = r"dashboard: http://127\.0\.0\.1:\d+/ was live during act 2; `gpufence demo --keep`"
    assert re.search(last + r" keeps it up after the demo$", told), told[-400:]


def test_keep_is_for_the_live_demo() -> None:
    result = CliRunner().invoke(app, ["demo", "--simulated", "--keep"])
    assert result.exit_code == 2
    assert "--keep" in result.output and "--simulated runs none" in " ".join(result.output.split())
