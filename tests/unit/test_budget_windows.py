"""Budget windows taken back after a restart keep every stop, also stops made at one instant."""

from __future__ import annotations

import math

from gpufence.sched.budget_windows import merged
from gpufence.sched.migdefrag_stop import DefragState
from gpufence.sched.protect import ProtectionState


def test_stops_made_together_each_keep_their_slot() -> None:
    # one incident noticed three jobs at t=100: three slots spent, not one
    assert list(merged((), (100.0, 100.0, 100.0), now=200.0)) == [100.0, 100.0, 100.0]


def test_a_rebuild_carrying_what_the_core_holds_counts_it_once() -> None:
    held = (100.0, 100.0, 150.0)
    assert list(merged(held, (100.0, 100.0, 150.0, 160.0), now=200.0)) == [
        100.0,
        100.0,
        150.0,
        160.0,
    ]


def test_times_no_stop_could_have_had_are_ignored() -> None:
    assert list(merged((), (math.nan, math.inf, 300.0, 50.0), now=200.0)) == [50.0]


def test_both_states_restore_through_it() -> None:
    saved = (("serving", (100.0, 100.0, 100.0)),)
    p = ProtectionState()
    p.restore(saved, 200.0)
    assert list(p.times["serving"]) == [100.0, 100.0, 100.0]
    d = DefragState()
    d.restore(saved, 200.0)
    assert list(d.times["serving"]) == [100.0, 100.0, 100.0]
