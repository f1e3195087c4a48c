"""The one job lifecycle table (model/lifecycle.py) and the front ends that use it."""

from __future__ import annotations

import pytest

from gpufence.cli import render
from gpufence.control.store import database as store
from gpufence.model import lifecycle
from gpufence.model.decisions import Assignment, Bind, Notice, Reason, Reject, Requeue, Stop
from gpufence.model.lifecycle import JobState as S


def test_terminal_states_move_nowhere_and_live_ones_can_end() -> None:
    assert {S.DONE, S.FAILED, S.CANCELLED, S.RECLAIMED, S.REJECTED} == lifecycle.TERMINAL
    for state in lifecycle.LIVE_STATES:
        assert lifecycle.TRANSITIONS[state] & lifecycle.TERMINAL, state
    assert set(lifecycle.STATES) == set(lifecycle.TRANSITIONS)


@pytest.mark.parametrize(
    ("old", "new", "ok"),
    [
        (S.PENDING, S.RUNNING, True),
        (S.RUNNING, S.STOPPING, True),
        (S.STOPPING, S.PENDING, True),  # requeued
        (S.DONE, S.RUNNING, False),
        (S.REJECTED, S.PENDING, False),
        (S.PENDING, S.STOPPING, False),  # nothing to stop
        (S.PENDING, S.RECLAIMED, False),
    ],
)
def test_legal_transitions(old: S, new: S, ok: bool) -> None:
    assert lifecycle.legal(old, new) is ok


def test_what_a_decision_and_a_stop_do_to_a_job() -> None:
    a = (Assignment(0, (0,)),)
    assert lifecycle.state_after(Bind("j", "p", a)) is S.RUNNING
    assert lifecycle.state_after(Stop("j", Reason.IDLE, False)) is S.STOPPING
    assert lifecycle.state_after(Requeue("j", Reason.IDLE, 2)) is S.PENDING
    assert lifecycle.state_after(Reject("j", Reason.INVALID, "x")) is S.REJECTED
    assert lifecycle.state_after(Notice("j", Reason.IDLE, 1.0)) is None
    assert lifecycle.after_stop(Reason.IDLE, requeue=False) is S.RECLAIMED
    assert lifecycle.after_stop(Reason.TIME_LIMIT, requeue=False) is S.FAILED
    assert lifecycle.after_stop(Reason.INCIDENT_PREEMPTION, requeue=True) is S.PENDING


def test_store_and_cli_speak_the_same_states() -> None:
    assert store.STATES == lifecycle.STATES
    assert set(store.TERMINAL) == lifecycle.TERMINAL
    assert set(render.ACTIVE_STATES) | set(render.TERMINAL_STATES) == set(lifecycle.STATES)
    assert set(render.STATE_STYLE) >= set(lifecycle.STATES)  # every state has a style
