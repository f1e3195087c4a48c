"""Waiting for real components (servers, processes, Ray nodes) in integration tests."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(cond: Callable[[], bool], limit_s: float, what: str) -> None:
    """Poll ``cond`` every 50 ms; fail naming ``what`` after ``limit_s`` seconds."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {limit_s} s waiting for {what}")
