"""``gpufence status``: a job's ending in one line (table-driven over the API's job objects)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufence.cli.failure import exit_text, failure_line, previous_attempt_line


def job(state: str, **kw: Any) -> dict[str, Any]:
    return {"id": "j1", "state": state, "attempt": 1, "spec": {"command": ["train"]}, **kw}


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (0, "exit code 0"),
        (1, "exit code 1"),
        (-9, "killed by SIGKILL (signal 9)"),
        (-15, "killed by SIGTERM (signal 15)"),
        (127, "exit code 127 (command not found)"),
        (126, "exit code 126 (command not executable)"),
        (137, "exit code 137 (128 + SIGKILL)"),
        (None, "no exit code (it never started, or was lost)"),
    ],
)
def test_exit_text(code: int | None, text: str) -> None:
    assert exit_text(code) == text


FAILURES: list[tuple[str, dict[str, Any], str | None, str | None]] = [
    ("done", job("done", exit_code=0), None, None),
    ("running", job("running"), None, None),
    (
        "exit code + stderr",
        job("failed", reason="exit-code", exit_code=2),
        "ValueError: bad lr",
        "exit code 2: ValueError: bad lr",
    ),
    ("exit code, no stderr", job("failed", reason="exit-code", exit_code=2), None, "exit code 2"),
    (
        "signal",
        job("failed", reason="exit-code", exit_code=-11),
        "ignored for signals",
        "killed by SIGSEGV (signal 11)",
    ),
    (
        "oom",
        job("failed", reason="oom", exit_code=-9, spec={"mem_bytes": 64 << 20}),
        None,
        "oom: killed by the out-of-memory killer (over its memory limit of 64M)",
    ),
    (
        "time limit",
        job("failed", reason="time-limit", exit_code=-15, spec={"time_limit_s": 1800}),
        None,
        "time-limit: stopped at its time limit of 30m (killed by SIGTERM (signal 15))",
    ),
    (
        "not found, from the launcher's message",
        job("failed", reason="exit-code", exit_code=127),
        "command not found: 'tarin': No such file or directory",
        "command not found: 'tarin': No such file or directory",
    ),
    (
        "not found, no message",
        job("failed", reason="exit-code", exit_code=127, spec={"command": ["tarin"]}),
        None,
        "command not found: 'tarin'",
    ),
    (
        "lost",
        job("failed", reason="lost", message="attempt 3 lost and max_attempts (3) used"),
        None,
        "lost: attempt 3 lost and max_attempts (3) used",
    ),
    (
        "cancelled",
        job("cancelled", exit_code=-15),
        None,
        "cancelled (killed by SIGTERM (signal 15))",
    ),
    (
        "rejected",
        job("rejected", reason="never-fits", message="9 GPUs per replica > 8"),
        None,
        "rejected (never-fits): 9 GPUs per replica > 8",
    ),
    ("reclaimed", job("reclaimed", reason="idle", message="idle 30m"), None, "idle: idle 30m"),
]


@pytest.mark.parametrize(
    ("j", "err", "line"), [f[1:] for f in FAILURES], ids=[f[0] for f in FAILURES]
)
def test_failure_line(j: dict[str, Any], err: str | None, line: str | None) -> None:
    assert failure_line(j, err) == line


def test_a_requeued_job_names_its_previous_attempt() -> None:
    attempts = [
        {"attempt": 1, "exit_codes": [-15, -15], "stop_reason": "preempt-incident", "requeue": True}
    ]
    pending = job("pending", attempt=2, exit_code=-15, attempts=attempts)
    assert failure_line(pending) is None  # not ended: no failure, whatever the row's exit_code
    assert (
        previous_attempt_line(pending)
        == "attempt 1: preempt-incident, killed by SIGTERM (signal 15), requeued"
    )
    assert previous_attempt_line(job("pending", attempt=1)) is None
    assert previous_attempt_line(job("done", attempt=2, attempts=attempts)) is None
