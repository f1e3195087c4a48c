"""Group commit's wait (``control/group_commit.py``), on real threads.

The window is long (30 s) where a test expects an early end: a broken early wake-up makes the
test take the window and fail on the returned value, so nothing here depends on timing.
"""

from __future__ import annotations

import threading

from gpufence.control.reconciler.group_commit import GroupCommit

WINDOW_S = 30.0


class Inbox:
    """The count of requests queued behind the first (what ``queue.qsize`` gives)."""

    def __init__(self) -> None:
        self.n = 0

    def qsize(self) -> int:
        return self.n


def test_the_wait_ends_when_the_batch_is_as_large_as_the_last_one() -> None:
    g = GroupCommit(WINDOW_S, 256)
    g.target = 3
    inbox = Inbox()

    def send_two() -> None:
        for _ in range(2):
            inbox.n += 1
            g.arrived(inbox.qsize)

    t = threading.Timer(0.05, send_two)
    t.start()
    assert g.wait(inbox.qsize) is True  # woken by the third request, not by the window
    t.join()
    g.taken(3)
    assert g.target == 3


def test_a_batch_already_queued_does_not_wait() -> None:
    g = GroupCommit(WINDOW_S, 256)
    g.target = 4
    inbox = Inbox()
    inbox.n = 5
    assert g.wait(inbox.qsize) is True
    g.taken(6)
    assert g.target == 6  # more than expected: the next batch waits for as many


def test_a_request_before_the_wait_is_counted_by_the_wait() -> None:
    """A request put while nobody waits sets nothing; the wait counts it itself."""
    g = GroupCommit(WINDOW_S, 256)
    g.target = 2
    inbox = Inbox()
    inbox.n = 1
    g.arrived(inbox.qsize)  # not waiting yet
    assert g.wait(inbox.qsize) is True


def test_a_window_that_ends_sets_the_target_to_what_arrived() -> None:
    g = GroupCommit(0.01, 256)
    g.target = 8
    inbox = Inbox()
    inbox.n = 2
    assert g.wait(inbox.qsize) is False  # three of eight: the window ran out
    g.taken(3)
    assert g.target == 3  # fewer clients now: the next batch does not wait for eight


def test_the_target_stays_within_one_and_the_batch_limit() -> None:
    g = GroupCommit(0.01, 16)
    g.taken(0)
    assert g.target == 1
    g.taken(100)
    assert g.target == 16
    g.target = 1
    assert g.wait(Inbox().qsize) is True  # one at a time: a lone request waits for nothing
