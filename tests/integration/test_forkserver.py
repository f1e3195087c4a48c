"""The fork server: launchers forked from a pre-started interpreter, and what its death changes.

Its children are independent launchers: killing the server (or the executor, which takes the
server along) leaves them running, their exits still reported from their records; the next
start makes a new server.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from executor_helpers import Recorder, make_launch, recorded

from gpufence.control.executors.local.local_executor import LocalExecutor


def test_a_killed_fork_server_is_replaced_and_its_launchers_run_on(
    tmp_path: Path, ex: LocalExecutor, rec: Recorder
) -> None:
    first = make_launch(tmp_path, command=("sh", "-c", "sleep 0.6; exit 3"), job="a")
    ex.start(first)
    server = ex._forks.pid
    assert server is not None
    os.kill(server, signal.SIGKILL)
    second = make_launch(tmp_path, command=("sh", "-c", "exit 4"), job="b")
    ex.start(second)  # a new server forks this one
    assert ex._forks.pid not in (None, server)
    codes = {ev.job_id: ev.codes for _, ev in (rec.exit(10), rec.exit(10))}
    assert codes == {"a": (3,), "b": (4,)}


def test_launchers_start_in_their_own_process_group_at_once(
    tmp_path: Path, ex: LocalExecutor, rec: Recorder
) -> None:
    launch = make_launch(tmp_path, command=("sleep", "30"))
    t0 = time.monotonic()
    ex.start(launch)
    leader = int(recorded(launch, 0, "pid")["pid"])
    assert os.getpgid(leader) == leader  # before start() returned: a stop finds the group
    ex.stop("job-1", 1, grace_s=5.0)
    assert rec.exit(5)[1].codes == (-signal.SIGTERM,)
    assert time.monotonic() - t0 < 5.0
