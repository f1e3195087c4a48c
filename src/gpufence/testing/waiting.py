"""Waiting for real components (servers, processes, files, jobs) in integration tests.

Every helper polls and fails with an ``AssertionError`` that names what it waited for, so a
timeout reads as the thing that did not happen rather than as a hang.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def until(cond: Callable[[], bool], limit_s: float, what: str, poll_s: float = 0.05) -> None:
    """Poll ``cond`` every ``poll_s``; fail naming ``what`` after ``limit_s`` seconds."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {limit_s} s waiting for {what}")


def until_value(
    read: Callable[[], T],
    ok: Callable[[T], bool],
    limit_s: float,
    what: str,
    poll_s: float = 0.05,
) -> T:
    """Poll ``read()`` until ``ok`` holds for its value and return that value; on timeout fail
    naming ``what`` and the last value read (what it was stuck at)."""
    end = time.monotonic() + limit_s
    while True:
        value = read()
        if ok(value):
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"timed out after {limit_s} s waiting for {what}: {value!r}")
        time.sleep(poll_s)


def file_appears(path: Path, limit_s: float = 5.0) -> None:
    """Wait for ``path`` to exist (a job's ready marker, a pid file), polling every 10 ms."""
    until(path.exists, limit_s, f"{path} to appear", poll_s=0.01)
