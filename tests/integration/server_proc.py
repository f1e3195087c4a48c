"""``gpufence up`` as a real subprocess (so it can be ``kill -9``-ed), for restart tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from gpufence.control.base.member_records import records_dir
from gpufence.control.http.client import Client
from gpufence.testing.waiting import until

JOB = [sys.executable, "-m", "gpufence.demo.programs"]


def up(
    data: Path,
    *extra: str,
    gpus: int = 4,
    env: Mapping[str, str] | None = None,
    expect_running: bool = True,
) -> subprocess.Popen[bytes]:
    """Start a server on ``data``; with ``expect_running`` wait until it serves."""
    cmd = [sys.executable, "-m", "gpufence", "up", "--fake-gpus", str(gpus), "--data", str(data)]
    log = open(data.parent / f"server-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [*cmd, "--port", "0", *extra],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    if expect_running:
        until(lambda: serving(data) == proc.pid or proc.poll() is not None, 60, "server up")
        assert proc.poll() is None, f"server exited at start: {last_log(data)}"
    return proc


def serving(data: Path) -> int | None:
    """The pid in ``DATA/server.json`` (written once the server listens)."""
    try:
        pid = json.loads((data / "server.json").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None
    return int(pid)


def last_log(data: Path) -> str:
    logs = sorted(data.parent.glob("server-*.log"))
    return logs[-1].read_text(errors="replace") if logs else ""


def kill9(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(20)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def client(data: Path) -> Client:
    return Client(data_dir=data)


def attempt_dir(data: Path, job: str, attempt: int) -> Path:
    return data / "jobs" / job / f"attempt-{attempt}"


def record_file(data: Path, job: str, attempt: int, rank: int, kind: str) -> Path:
    """The launcher's ``rank-R.<kind>`` record (pid, started, exit): in the attempt's records
    directory (the control plane's, ``member_records.records_dir``)."""
    return records_dir(attempt_dir(data, job, attempt)) / f"rank-{rank}.{kind}"


def record(data: Path, job: str, attempt: int, rank: int, kind: str) -> dict[str, object]:
    out: dict[str, object] = json.loads(record_file(data, job, attempt, rank, kind).read_text())
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")
