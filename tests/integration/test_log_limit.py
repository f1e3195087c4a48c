"""Issue 30 case 4, the per-job log cap: a job printing far past ``--log-limit`` never has a log
over the limit, not even for a moment (its output goes through the launcher's log pump), its log
says so, and the pump leaves ``rank-R.logcap`` for the control plane's ``log-limit`` event as
soon as it first cuts. A job that leaves a daemon holding its stdout still ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from gpufence.control.base.member_records import err_file, logcap_file, out_file, records_dir
from gpufence.control.executors.processes import LAUNCHER
from gpufence.testing.waiting import until

LIMIT = 256 * 1024
# prints 64 MiB to stdout and a little to stderr, says so in ./flooded (its cwd is the test's
# directory), then sleeps: the cap is checked while it runs
FLOOD = (
    "import os, sys, time\n"
    "chunk = b'x' * 65535 + b'\\n'\n"
    "for i in range(1024):\n"
    "    os.write(1, chunk)\n"
    "    if i == 0: os.write(2, b'started\\n')\n"
    "open('flooded', 'w').close()\n"
    "time.sleep(5)\n"
    "os.write(1, b'the last line\\n')\n"
)


def _launch(adir: Path, *extra: str) -> subprocess.Popen[bytes]:
    adir.mkdir(parents=True)
    records_dir(adir).mkdir()
    argv = [sys.executable, "-I", "-S", str(LAUNCHER), str(adir), "--rank", "0", *extra]
    return subprocess.Popen(
        [*argv, "--", sys.executable, "-c", FLOOD], start_new_session=True, cwd=adir.parent
    )


def test_a_flooding_job_keeps_its_log_near_the_limit(tmp_path: Path) -> None:
    adir = tmp_path / "attempt-1"
    proc = _launch(adir, "--log-limit", str(LIMIT))
    biggest = 0  # the log's size, sampled all through the flood
    while not (tmp_path / "flooded").exists():
        if out_file(adir, 0).exists():
            biggest = max(biggest, out_file(adir, 0).stat().st_size)
        assert proc.poll() is None
    assert biggest <= LIMIT, biggest
    assert out_file(adir, 0).stat().st_size <= LIMIT
    until(logcap_file(adir, 0).exists, 5, "the cut recorded while the job runs")
    assert proc.poll() is None, "recorded while the job runs, not when it exits"
    assert proc.wait(30) == 0
    out = out_file(adir, 0).read_bytes()
    assert len(out) <= LIMIT
    head, sep, tail = out.partition(b"\n[gpufence] log limit of 262144 bytes reached")
    assert sep, out[-400:]
    assert len(head) == LIMIT // 2 and head.startswith(b"xxxx")
    assert tail.endswith(b"the last line\n")  # the newest output survives
    assert err_file(adir, 0).read_bytes() == b"started\n"  # stderr was under its limit
    rec = json.loads(logcap_file(adir, 0).read_text())
    assert rec["limit"] == LIMIT and rec["dropped"] > 60 * 2**20, rec


def test_without_a_limit_nothing_is_cut(tmp_path: Path) -> None:
    adir = tmp_path / "attempt-1"
    proc = _launch(adir)
    assert proc.wait(30) == 0
    assert out_file(adir, 0).stat().st_size == 1024 * 65536 + len(b"the last line\n")
    assert not logcap_file(adir, 0).exists()


def test_a_daemon_holding_the_log_does_not_hold_the_exit(tmp_path: Path) -> None:
    adir = tmp_path / "attempt-1"
    adir.mkdir(parents=True)
    records_dir(adir).mkdir()
    # the job starts a process that outlives it with its stdout, then exits
    job = "import subprocess; subprocess.Popen(['sleep', '30']); print('bye', flush=True)"
    argv = [sys.executable, "-I", "-S", str(LAUNCHER), str(adir), "--rank", "0"]
    proc = subprocess.Popen(
        [*argv, "--log-limit", str(LIMIT), "--", sys.executable, "-c", job],
        start_new_session=True,
    )
    try:
        assert proc.wait(10) == 0  # not when the sleep ends
        assert out_file(adir, 0).read_bytes() == b"bye\n"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
