"""The stop and gang rules both executors share (executors.gang.GangState)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufence.control.base.executor import AttemptExit, Launch
from gpufence.control.executors.gang import GangState


def state() -> GangState:
    launch = Launch("j1", 2, ("true",), {}, (), Path("a"), Path("c"))
    return GangState(launch)


@pytest.mark.parametrize(
    ("code", "stopped", "already_failed", "fails"),
    [
        (1, False, False, True),  # a member failed on its own: the gang goes down
        (-9, False, False, True),  # killed by a signal nobody here sent
        (None, False, False, True),  # no exit record: unknown is not success
        (0, False, False, False),  # a member that finished early is fine
        (1, True, False, False),  # exits after a stop are the stop's doing
        (1, False, True, False),  # the gang is already coming down
    ],
)
def test_which_exits_bring_the_gang_down(
    code: int | None, stopped: bool, already_failed: bool, fails: bool
) -> None:
    s = state()
    s.stop_requested, s.gang_failed = stopped, already_failed
    assert s.fails_gang(code) is fails


def test_stop_asks_once_and_keeps_the_earliest_kill() -> None:
    s = state()
    assert s.request_stop(10.0) is True
    assert s.request_stop(5.0) is False  # second stop: no second SIGTERM, earlier deadline
    assert s.request_stop(20.0) is False and s.kill_at == 5.0
    assert s.kill_due(4.9) is False
    assert s.kill_due(5.0) is True and s.kill_at is None
    assert s.kill_due(6.0) is False  # fires once


def test_exit_event() -> None:
    s = state()
    assert s.key == ("j1", 2)
    assert s.exit_event((0, 0)) == AttemptExit("j1", 2, True, (0, 0), False)
    s.request_stop(1.0)
    assert s.exit_event((0, -15)) == AttemptExit("j1", 2, False, (0, -15), True)
    assert s.exit_event(()).succeeded is False  # no member: nothing succeeded
