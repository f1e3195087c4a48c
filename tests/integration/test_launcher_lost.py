"""Issue 11 (recovery is exact, also while the control plane runs): a member's launcher killed
by someone else (the OOM killer, an operator's kill -9) together with its supervisor leaves
the job's outcome unknown (either one alone does not: the other records the exit). The
attempt is lost -- requeued as the next one while ``max_attempts`` allows, as when it happens
while the control plane is down -- not failed with the launcher's signal; and the next attempt
never runs beside what is left of the first. Real server, real processes, real cgroups.
"""

from __future__ import annotations

import os
import signal
import sys
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


def _started(data: Path, jid: str) -> dict[str, object]:
    """The member's started record, or {} while the launcher has not written it yet (a job
    shows as running once the plane spawned it; the record comes a moment later)."""
    try:
        return dict(record(data, jid, 1, 0, "started"))
    except FileNotFoundError:
        return {}


def _kill_keepers(data: Path, jid: str) -> None:
    """SIGKILL the member's supervisor (its recorded pid) and then its launcher (the job's
    parent): nobody is left who could learn how the job ends."""
    until(lambda: "launcher" in _started(data, jid), 10, "started record")
    supervisor = int(str(record(data, jid, 1, 0, "pid")["pid"]))
    launcher = int(str(record(data, jid, 1, 0, "started")["launcher"]))
    assert _child_of(supervisor) == launcher
    os.kill(supervisor, signal.SIGKILL)
    os.kill(launcher, signal.SIGKILL)


def test_a_launcher_killed_while_the_plane_runs_requeues_the_attempt(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    server = up(data, gpus=1)  # one GPU: the next attempt gets the same one
    try:
        c = client(data)
        body = {"command": [*JOB, "sleep", "30"], "gpus": 1, "max_attempts": 2}
        jid = str(c.submit(body)["id"])
        until(lambda: c.job(jid)["state"] == "running", 30, "attempt 1 running")
        _kill_keepers(data, jid)
        job_process = int(str(record(data, jid, 1, 0, "started")["pid"]))
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
        _kill_keepers(data, other)
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


# the job appends "start-N" when it starts and "end-N" when it ends (N: its attempt), and waits
# for the test's go-file in between
RUN_LOG = """
import os, sys, time
log, go = sys.argv[1], sys.argv[2]
n = os.environ["GPUFENCE_ATTEMPT"]
open(log, "a").write(f"start-{n} ")
while not os.path.exists(go):
    time.sleep(0.05)
open(log, "a").write(f"end-{n} ")
"""


@pytest.mark.parametrize("victim", ["launcher", "supervisor"])
def test_a_job_completing_while_the_plane_is_down_and_its_launcher_dead_never_runs_again(
    tmp_path: Path, victim: str
) -> None:
    """Issue 30, case 5: the plane is down, the job's launcher is killed (kill -9), then the job
    exits 0. The exit is recorded all the same (by the member's supervisor; or by the launcher
    when the supervisor is the one killed), so the restarted plane finds the job done: its log
    reads ``start-1 end-1``, not ``start-1 end-1 start-2 end-2``."""
    data = tmp_path / "data"
    data.mkdir()
    log, go = tmp_path / "runs.log", tmp_path / "go"
    server = up(data, gpus=1)
    try:
        c = client(data)
        body = {"command": [sys.executable, "-c", RUN_LOG, str(log), str(go)], "gpus": 1}
        jid = str(c.submit(body)["id"])
        until(lambda: c.job(jid)["state"] == "running" and log.exists(), 30, "running")
        until(lambda: "pid" in _started(data, jid), 10, "started record")
        stop(server)  # the plane goes down; the job runs on
        if victim == "supervisor":
            pid = int(str(record(data, jid, 1, 0, "pid")["pid"]))
        else:
            pid = int(str(record(data, jid, 1, 0, "started")["launcher"]))
        os.kill(pid, signal.SIGKILL)
        until(lambda: not alive(pid), 10, f"{victim} gone")
        go.touch()  # the job now completes, exit 0
        until(lambda: log.read_text().strip().endswith("end-1"), 10, "the job's end")
        until(lambda: record(data, jid, 1, 0, "exit").get("code") == 0, 10, "its exit record")
        server = up(data, gpus=1)
        c = client(data)
        until(lambda: c.job(jid)["state"] in ("done", "failed", "queued"), 30, "settled")
        time.sleep(1.0)  # a wrong requeue would start attempt 2 now
        job = c.job(jid)
        assert job["state"] == "done" and job["attempt"] == 1, job
        assert log.read_text().split() == ["start-1", "end-1"]
    finally:
        stop(server)
        kill_leftovers(data)


def test_a_supervisor_killed_while_the_plane_runs_leaves_the_launcher_to_record(
    tmp_path: Path,
) -> None:
    """Only the recorded pid (the member's supervisor) is killed while the plane runs: the
    launcher still runs the job and records its exit, which the plane now watches for."""
    data = tmp_path / "data"
    data.mkdir()
    log, go = tmp_path / "runs.log", tmp_path / "go"
    server = up(data, gpus=1)
    try:
        c = client(data)
        body = {"command": [sys.executable, "-c", RUN_LOG, str(log), str(go)], "gpus": 1}
        jid = str(c.submit(body)["id"])
        until(lambda: c.job(jid)["state"] == "running" and log.exists(), 30, "running")
        os.kill(int(str(record(data, jid, 1, 0, "pid")["pid"])), signal.SIGKILL)
        time.sleep(1.0)
        assert c.job(jid)["state"] == "running", c.job(jid)
        go.touch()
        until(lambda: c.job(jid)["state"] == "done", 30, "done")
        assert c.job(jid)["attempt"] == 1 and log.read_text().split() == ["start-1", "end-1"]
    finally:
        stop(server)
        kill_leftovers(data)
