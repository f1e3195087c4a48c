"""A job's ending in one line, for ``gpufence status`` (and its ``-o json`` ``failure`` field).

From what the API returns (the job, its attempts, and the last line its failing member wrote to
stderr): ``exit code 1: ZeroDivisionError: division by zero``, ``killed by SIGKILL (signal 9)``,
``oom: killed by the out-of-memory killer (over its memory limit of 64 MiB)``,
``time-limit: stopped at its time limit of 30s (SIGTERM)``, ``command not found: 'nope'``.

Exit codes as the executor records them: a negative code is the signal that killed the process
(-9: SIGKILL); 127 and 126 are the launcher's "command not found" / "not executable"; a shell
that reports its child's signal death exits 128 + the signal.
"""

from __future__ import annotations

import signal
from typing import Any

from gpufence.cli.units import format_duration, format_size

NOT_FOUND = 127
NOT_EXECUTABLE = 126
ENDED_BADLY = ("failed", "reclaimed", "rejected", "cancelled")


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_text(code: int | None) -> str:
    """``exit code 1``, ``killed by SIGKILL (signal 9)``, ``exit code 137 (128 + SIGKILL)``."""
    if code is None:
        return "no exit code (it never started, or was lost)"
    if code < 0:
        return f"killed by {signal_name(-code)} (signal {-code})"
    if code == NOT_FOUND:
        return "exit code 127 (command not found)"
    if code == NOT_EXECUTABLE:
        return "exit code 126 (command not executable)"
    if 128 < code < 128 + 65:
        return f"exit code {code} (128 + {signal_name(code - 128)})"
    return f"exit code {code}"


def short_code(code: int | None) -> str:
    """A code for a table cell: ``0``, ``1``, ``-9 SIGKILL``."""
    if code is None:
        return "-"
    return f"{code} {signal_name(-code)}" if code < 0 else str(code)


def failing_rank(attempt: dict[str, Any] | None) -> int:
    """The rank whose exit made the attempt fail (the first non-zero code), else 0."""
    codes = (attempt or {}).get("exit_codes") or []
    for rank, code in enumerate(codes):
        if code not in (0, None):
            return rank
    return 0


def _attempt(job: dict[str, Any], number: int) -> dict[str, Any] | None:
    for a in job.get("attempts") or []:
        if a.get("attempt") == number:
            return dict(a)
    return None


def failure_line(job: dict[str, Any], last_err: str | None = None) -> str | None:
    """Why the job ended badly, in one line; None for a job that is fine or not ended."""
    state = job.get("state")
    if state not in ENDED_BADLY:
        return None
    reason = job.get("reason") or ""
    message = job.get("message") or ""
    code = job.get("exit_code")
    spec = job.get("spec") or {}
    if state == "cancelled" and reason == "dependency":
        return f"cancelled: {message}" if message else "cancelled (dependency)"
    if state == "cancelled":
        return "cancelled" + (f" ({exit_text(code)})" if code not in (None, 0) else "")
    if state == "rejected":
        return f"rejected ({reason}): {message}" if message else f"rejected ({reason})"
    if reason == "oom":
        limit = spec.get("mem_bytes")
        over = f" (over its memory limit of {_size(limit)})" if limit else ""
        return f"oom: killed by the out-of-memory killer{over}"
    if reason == "time-limit":
        limit = spec.get("time_limit_s")
        at = f" of {format_duration(float(limit))}" if limit else ""
        how = f" ({exit_text(code)})" if code not in (None, 0) else ""
        return f"time-limit: stopped at its time limit{at}{how}"
    if code == NOT_FOUND:
        if last_err and last_err.startswith("command not found"):
            return last_err
        return f"command not found: {(spec.get('command') or ['?'])[0]!r}"
    if code is not None and code != 0:
        tail = f": {last_err}" if last_err and code > 0 else ""
        return exit_text(code) + tail
    if reason and reason != "exit-code":
        return f"{reason}: {message}" if message else reason
    return message or state


def previous_attempt_line(job: dict[str, Any]) -> str | None:
    """For a job that is pending or running again after a requeue: how the attempt before the
    current one ended (so its exit code is not mistaken for the current attempt's)."""
    current = int(job.get("attempt") or 1)
    if current <= 1 or job.get("state") not in ("pending", "starting", "running", "stopping"):
        return None
    prev = _attempt(job, current - 1)
    if prev is None:
        return None
    codes = prev.get("exit_codes") or []
    code = next((c for c in codes if c not in (0, None)), codes[0] if codes else None)
    why = prev.get("stop_reason") or "ended"
    requeued = ", requeued" if prev.get("requeue") or job.get("state") == "pending" else ""
    return f"attempt {current - 1}: {why}, {exit_text(code)}{requeued}"


def _size(n: Any) -> str:
    return format_size(int(n))
