"""``gpufence reserve --start``: now, a time from now, or an ISO 8601 time (UTC unless it
says); anything else is refused naming the flag and the forms (exit 2)."""

from __future__ import annotations

import pytest
import typer

from gpufence.cli.node_verbs import parse_start

CASES = [
    ("now", {"start_in_s": 0.0}),
    ("+2h", {"start_in_s": 7200.0}),
    ("in 30m", {"start_in_s": 1800.0}),
    ("2026-12-06T02:00", {"start": 1796522400.0}),
    ("2026-12-06 02:00:30Z", {"start": 1796522430.0}),
    ("2026-12-06T03:00+01:00", {"start": 1796522400.0}),
]


@pytest.mark.parametrize(("text", "expected"), CASES, ids=[c[0] for c in CASES])
def test_start_forms(text: str, expected: dict[str, float]) -> None:
    assert parse_start(text) == expected


@pytest.mark.parametrize("text", ["tomorrow", "+2 fortnights", "12/06/2026"])
def test_a_start_that_is_no_time_is_refused(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as got:
        parse_start(text)
    assert got.value.exit_code == 2
    assert "--start" in capsys.readouterr().err
