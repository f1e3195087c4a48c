"""The launcher records whether a stop reached its member before the command exited.

A real launcher subprocess (leading its own process group, as the executors start it) runs a
real command. Its exit record's ``stop`` is what the control plane reads to tell a job that
finished its work just as it was being stopped (done: never run again) from one that exited
0 on the stop's SIGTERM (requeued): ``record_reads.stop_reached``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from gpufence.control.base import launcher
from gpufence.control.base.member_records import exit_file, records_dir
from gpufence.control.base.record_reads import recorded_exit, recorded_stop, stop_reached
from gpufence.testing.waiting import until

# exits 0 on SIGTERM/SIGINT/SIGUSR1 (a graceful checkpoint-and-exit), after saying it is ready
TRAPPING = """
import signal, sys, time
def done(*_):
    sys.exit(0)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(s, done)
open(sys.argv[1], "w").close()
time.sleep(60)
sys.exit(3)
"""


def _launch(adir: Path, rank: int, command: list[str]) -> subprocess.Popen[bytes]:
    adir.mkdir(parents=True, exist_ok=True)
    records_dir(adir).mkdir(exist_ok=True)
    argv = [sys.executable, launcher.__file__, str(adir), "--rank", str(rank), "--", *command]
    return subprocess.Popen(argv, start_new_session=True)


def _record(adir: Path, rank: int = 0) -> dict[str, object]:
    out: dict[str, object] = json.loads(exit_file(adir, rank).read_text())
    return out


def _trapping(adir: Path, rank: int, sig: signal.Signals) -> subprocess.Popen[bytes]:
    ready = adir / f"ready-{rank}"
    p = _launch(adir, rank, [sys.executable, "-c", TRAPPING, str(ready)])
    until(ready.exists, 20, "the command to start")
    os.killpg(p.pid, sig)  # as the executors stop a member: the whole group
    assert p.wait(20) == 0
    return p


def test_a_command_that_exits_0_on_its_own_records_no_stop(tmp_path: Path) -> None:
    adir = tmp_path / "attempt-1"
    assert _launch(adir, 0, ["true"]).wait(20) == 0
    assert _record(adir)["stop"] is False
    assert (recorded_exit(adir, 0), recorded_stop(adir, 0)) == (0, False)
    assert stop_reached(adir, 1) is False


def test_a_command_that_exits_0_on_the_stops_sigterm_records_the_stop(tmp_path: Path) -> None:
    adir = tmp_path / "attempt-1"
    _trapping(adir, 0, signal.SIGTERM)
    assert _record(adir)["code"] == 0 and _record(adir)["stop"] is True
    assert stop_reached(adir, 1) is True


def test_the_checkpoint_notice_is_not_a_stop(tmp_path: Path) -> None:
    """SIGUSR1 (the notice) asks for a checkpoint; a command that exits 0 after it ended on its
    own terms, no stop reached it."""
    adir = tmp_path / "attempt-1"
    _trapping(adir, 0, signal.SIGUSR1)
    assert _record(adir)["stop"] is False


def test_one_member_reached_by_a_stop_makes_the_attempts_stop_reached(tmp_path: Path) -> None:
    adir = tmp_path / "attempt-1"
    assert _launch(adir, 0, ["true"]).wait(20) == 0
    _trapping(adir, 1, signal.SIGINT)
    assert (recorded_stop(adir, 0), recorded_stop(adir, 1)) == (False, True)
    assert stop_reached(adir, 2) is True


def test_a_record_without_stop_or_without_a_code_is_unknown(tmp_path: Path) -> None:
    """An older launcher's record, or none yet: unknown (None), which keeps the old rule."""
    adir = tmp_path / "attempt-1"
    records_dir(adir).mkdir(parents=True)
    exit_file(adir, 0).write_text('{"code": 0, "ended_unix": 1.0}\n')
    assert (recorded_exit(adir, 0), recorded_stop(adir, 0)) == (0, None)
    assert stop_reached(adir, 1) is None
    assert stop_reached(adir, 2) is None  # rank 1 has no record at all
    exit_file(adir, 0).write_text('{"code": null, "stop": false}\n')  # not exited yet
    assert recorded_stop(adir, 0) is None
