"""Issue 11 (recovery is exact, also while the control plane runs): a member's launcher killed
by someone else (the OOM killer, an operator's kill -9) leaves the job's outcome unknown. The
attempt is lost -- requeued as the next one while ``max_attempts`` allows, as when it happens
while the control plane is down -- not failed with the launcher's signal; and the next attempt
never runs beside what is left of the first. Real server, real processes, real cgroups.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from server_proc import JOB, alive, client, record, stop, up

from gpufence.testing.crashrun import kill_leftovers
from gpufence.testing.waiting import until


def _child_of(pid: int) -> int:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def test_a_launcher_killed_while_the_plane_runs_requeues_the_attempt(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    server = up(data, gpus=1)  # one GPU: the next attempt gets the same one
    try:
        c = client(data)
        body = {"command": [*JOB, "sleep", "30"], "gpus": 1, "max_attempts": 2}
        jid = str(c.submit(body)["id"])
        until(lambda: c.job(jid)["state"] == "running", 30, "attempt 1 running")
        launcher = int(str(record(data, jid, 1, 0, "pid")["pid"]))
        job_process = _child_of(launcher)
        os.kill(launcher, signal.SIGKILL)
        until(lambda: c.job(jid)["attempt"] == 2 and c.job(jid)["state"] == "running", 60, "2")
        # what the dead launcher left was killed before the next attempt got the GPU
        assert not alive(job_process)
        kinds = [e["kind"] for e in c.events(job_id=jid)]
        assert "lost" in kinds and "requeue" in kinds, kinds
        c.cancel(jid)
        until(lambda: c.job(jid)["state"] == "cancelled", 30, "cancelled")
        # a loss on the last attempt: failed as lost, not requeued again
        body["max_attempts"] = 1
        other = str(c.submit(body)["id"])
        until(lambda: c.job(other)["state"] == "running", 30, "running")
        os.kill(int(str(record(data, other, 1, 0, "pid")["pid"])), signal.SIGKILL)
        until(lambda: c.job(other)["state"] == "failed", 30, "failed")
        assert c.job(other)["reason"] == "lost", c.job(other)
    finally:
        stop(server)
        kill_leftovers(data)


def test_an_exit_found_after_a_restart_is_charged_until_the_job_ended(tmp_path: Path) -> None:
    """A job that ends while the control plane is down: its end is the launcher's record,
    not the restart (accounting would charge the GPU-time of the whole outage)."""
    data = tmp_path / "data"
    data.mkdir()
    server = up(data)
    try:
        c = client(data)
        jid = str(c.submit({"command": [*JOB, "sleep", "1"], "gpus": 1})["id"])
        until(lambda: c.job(jid)["state"] == "running", 30, "running")
        os.kill(server.pid, signal.SIGKILL)
        server.wait(20)
        until(lambda: "ended_unix" in record(data, jid, 1, 0, "exit"), 30, "the job's exit")
        ended = float(str(record(data, jid, 1, 0, "exit")["ended_unix"]))
        time.sleep(3)  # the outage goes on after the job ended
        server = up(data)
        job = client(data).job(jid)
        assert job["state"] == "done" and job["ended_at"] == pytest.approx(ended, abs=0.01), job
        (row,) = [h for h in client(data).history() if h["id"] == jid]
        assert row["elapsed_s"] < 3.0, row  # ~1 s of sleep, not 4+ s with the outage
    finally:
        stop(server)
        kill_leftovers(data)
