"""The core's closure messages give plane-clock times as UTC dates without importing datetime
(the core may not): checked against datetime over four centuries, leap days included."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpufence.state.closures import utc, when


@pytest.mark.parametrize(
    "t",
    [0, 951782400, 951868799, 1796522400, 4107542399, 1e8, 1709164800.9, 253402300799],
)
def test_utc_matches_datetime(t: float) -> None:
    expected = datetime.fromtimestamp(int(t), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert utc(t) == expected


def test_every_day_of_four_centuries_matches() -> None:
    for day in range(0, 146097 * 1 + 400, 1):  # one full 400-year cycle from 1970
        t = day * 86400 + 3723
        assert utc(t) == datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def test_small_times_stay_as_the_scenarios_write_them() -> None:
    assert when(100.0) == "t=100" and when(2.5) == "t=2.5"
    assert when(1796522400.0) == "2026-12-06 02:00:00 UTC"
