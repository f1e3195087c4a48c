"""Issue 30 item 10: a start-up that asks what still runs for many attempts (a damaged store's
hint, a missing store's check) reads ``/proc`` once, not once per attempt (300 attempts whose
launchers died took 12.9 s)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpufence.control.base.member_records import pid_record, proc_start_time, records_dir
from gpufence.control.executors import leftovers
from gpufence.control.recovery.recovery import damaged_hint

ATTEMPTS = 300


def _dead_launcher() -> tuple[int, int]:
    """(pid, start time) of a process that has exited: what a dead launcher's record names."""
    proc = subprocess.Popen(["sleep", "30"])
    start = proc_start_time(proc.pid)
    assert start is not None
    proc.kill()
    proc.wait()
    return proc.pid, start


def test_a_damaged_stores_hint_reads_proc_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    pid, start = _dead_launcher()
    for n in range(1, ATTEMPTS + 1):
        adir = data / "jobs" / f"j{n}" / "attempt-1"
        adir.mkdir(parents=True)
        records_dir(adir).mkdir()
        (records_dir(adir) / "rank-0.pid").write_text(pid_record(pid, start))
    scans = []
    real = os.listdir

    def listdir(path: Any = ".") -> list[str]:
        if str(path) == "/proc":
            scans.append(path)
        return real(path)

    monkeypatch.setattr(leftovers.os, "listdir", listdir)
    hint = damaged_hint(data)
    assert "restore it from a backup" in hint and "still run" not in hint, hint
    assert len(scans) == 1, f"/proc read {len(scans)} times for {ATTEMPTS} attempts"
