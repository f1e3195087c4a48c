"""The launcher's fence: a member started with ``--fence-parent 1`` (Ray node agents) does not
outlive its starter, so a job the control plane declared lost never runs twice; without it
(the local executor) the member survives its starter and is adopted after a restart."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpufence.control.base.member_records import exit_file, started_file
from gpufence.control.executors.processes import LAUNCHER
from gpufence.testing.waiting import until

STARTER = """
import os, subprocess, sys, time
extra = [str(os.getpid()) if x == "PID" else x for x in {extra!r}]
argv = [sys.executable, '-I', '-S', {launcher!r}, {adir!r}, '--rank', '0', *extra,
        '--', 'sleep', '60']
p = subprocess.Popen(argv, start_new_session=True)
print(p.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start(adir: Path, extra: list[str]) -> tuple[subprocess.Popen[bytes], int, int]:
    code = STARTER.format(launcher=str(LAUNCHER), adir=str(adir), extra=extra)
    starter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert starter.stdout is not None
    launcher = int(starter.stdout.readline())
    started = started_file(adir, 0)
    until(started.exists, 10, "the command to be exec'd")
    command = int(json.loads(started.read_text())["pid"])
    return starter, launcher, command


@pytest.mark.parametrize("fence", [True, False], ids=["fenced", "survives"])
def test_member_and_its_starter(tmp_path: Path, fence: bool) -> None:
    adir = tmp_path / "attempt-1"
    adir.mkdir()
    starter, launcher, command = _start(adir, ["--fence-parent", "PID"] if fence else [])
    try:
        starter.kill()  # the starter (agent) dies without cleaning up
        starter.wait(10)
        if fence:
            until(lambda: exit_file(adir, 0).exists(), 10, "the fenced member's exit record")
            assert json.loads(exit_file(adir, 0).read_text())["code"] == -signal.SIGTERM
            until(lambda: not _alive(command) and not _alive(launcher), 10, "the group to end")
        else:
            until(lambda: False or starter.poll() is not None, 1, "the starter to be gone")
            assert _alive(command) and _alive(launcher)
            assert not exit_file(adir, 0).exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher, signal.SIGKILL)
