"""The data directory as ``gpufence up --data`` names it (issue 30, cases 2, 8 and 9), on a real
server with real processes and cgroups:

* a restart through another path to the same directory (a symlink) finds the same members:
  a job's ``setsid`` daemon is killed with its cgroup when the job ends, not left holding the
  GPU the next job is given;
* an existing directory that is not gpufence's is refused, untouched;
* a store deleted or moved under a running server is not silently replaced by an empty one at
  the next start.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from server_proc import alive, client, stop, up

from gpufence.testing.crashrun import kill_leftovers
from gpufence.testing.waiting import until

# starts a daemon in its own session (it leaves the process group, not the cgroup), writes its
# pid, then waits for the test's go-file and exits 0
DAEMON_JOB = """
import os, subprocess, sys, time
d = subprocess.Popen(["sleep", "300"], start_new_session=True)
open(sys.argv[1] + ".tmp", "w").write(str(d.pid))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
"""


def test_a_restart_through_a_symlink_keeps_containment(tmp_path: Path) -> None:
    real = tmp_path / "data"
    real.mkdir()
    link = tmp_path / "via-link"
    link.symlink_to(real)
    pidfile, go = tmp_path / "daemon.pid", tmp_path / "go"
    server = up(link, gpus=1)
    daemon = 0
    try:
        c = client(link)
        body = {"command": [sys.executable, "-c", DAEMON_JOB, str(pidfile), str(go)], "gpus": 1}
        jid = str(c.submit(body)["id"])
        until(lambda: pidfile.exists(), 30, "the daemon")
        daemon = int(pidfile.read_text())
        stop(server)  # the job and its daemon run on
        server = up(real, gpus=1)  # the same directory, by its real path
        c = client(real)
        go.touch()
        until(lambda: c.job(jid)["state"] == "done", 30, "done")
        # its cgroup was found again and emptied: the daemon went with it
        until(lambda: not alive(daemon), 10, "the job's daemon killed with its cgroup")
    finally:
        stop(server)
        kill_leftovers(real)
        if daemon and alive(daemon):
            os.kill(daemon, 9)


def _refused(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the server exited with an error at start (one still running is stopped)."""
    try:
        return proc.wait(30) != 0
    except subprocess.TimeoutExpired:
        stop(proc)
        return False


def test_an_existing_directory_that_is_not_gpufences_is_refused_untouched(tmp_path: Path) -> None:
    other = tmp_path / "srv"
    other.mkdir(mode=0o755)
    (other / "index.html").write_text("<p>someone's site</p>")
    os.chmod(other / "index.html", 0o644)
    proc = up(other, expect_running=False)
    assert _refused(proc), "it started on someone else's directory"
    log = "".join(p.read_text() for p in tmp_path.glob("server-*.log"))
    assert "not a gpufence data directory" in log, log[-2000:]
    assert stat.S_IMODE(other.stat().st_mode) == 0o755, "its mode was changed"
    assert stat.S_IMODE((other / "index.html").stat().st_mode) == 0o644
    assert sorted(p.name for p in other.iterdir()) == ["index.html"], "something was created"


def test_a_store_deleted_under_a_running_server_is_not_replaced_by_an_empty_one(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    server = up(data, gpus=1)
    try:
        c = client(data)
        jid = str(c.submit({"command": ["true"], "gpus": 1})["id"])
        until(lambda: c.job(jid)["state"] == "done", 30, "done")
        (data / "gpufence.db").rename(tmp_path / "moved.db")  # an operator's mistake
    finally:
        stop(server)
    proc = up(data, expect_running=False)
    assert _refused(proc), "started on a new, empty store: the acknowledged jobs are gone"
    log = "".join(p.read_text() for p in tmp_path.glob("server-*.log"))
    assert "gpufence.db" in log and "missing" in log, log[-2000:]
    assert not (data / "gpufence.db").exists()
