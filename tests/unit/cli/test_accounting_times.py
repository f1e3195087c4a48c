"""``--since`` / ``--until`` of ``history`` and ``usage``: ISO times, durations ago, now, all."""

from __future__ import annotations

from datetime import datetime

import pytest
import typer

from gpufence.cli.accounting_verbs import parse_when

NOW = 1_800_000_000.0
LOCAL_MIDNIGHT = datetime(2026, 12, 1).timestamp()

CASES = [
    ("2h", NOW - 7200),
    ("7d", NOW - 7 * 86400),
    ("1h30m", NOW - 5400),
    ("90", NOW - 90),
    ("now", NOW),
    ("all", None),
    ("2026-12-01T09:30:00Z", 1796117400.0),
    ("2026-12-01T10:30:00+01:00", 1796117400.0),
    ("2026-12-01", LOCAL_MIDNIGHT),
    ("2026-12-01 00:00", LOCAL_MIDNIGHT),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_when(text: str, expected: float | None) -> None:
    assert parse_when(text, NOW, "--since") == expected


@pytest.mark.parametrize("text", ["yesterday", "2026-13-01", "2h ago", "-5m", ""])
def test_bad_when_names_the_flag_and_the_forms(text: str) -> None:
    with pytest.raises(typer.BadParameter) as err:
        parse_when(text, NOW, "--until")
    assert err.value.param_hint == "--until"
