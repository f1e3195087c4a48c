"""The control plane end to end: real SQLite file, real processes, real server restarts.

* the seed's 66-job case (short jobs) with the oversubscription check from the jobs' own logs;
* the preemption handshake, with an ack and without one (grace expiry);
* ``kill -9`` of the server mid-run, then a restart: every job accounted for exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufence.control.base.config import ADMIN, cluster_from_spec_dict, control_config
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.gpus.discovery import fake_gpus, node_spec
from gpufence.control.http.client import Client
from gpufence.control.plane import ControlPlane
from gpufence.control.store import database as st
from gpufence.demo import joblogs
from gpufence.demo.live import fenced_spec
from gpufence.testing.waiting import until

pytestmark = pytest.mark.slow  # real control planes, processes and restarts (~60 s)

JOB = [sys.executable, "-m", "gpufence.demo.programs"]


def _req(*args: str, **fields: Any) -> SubmitRequest:
    return SubmitRequest.model_validate({"command": [*JOB, *args], **fields})


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], ControlPlane]]:
    made: list[ControlPlane] = []

    def make(spec: dict[str, Any]) -> ControlPlane:
        cfg = control_config({"activity_interval_s": 0.2, "stop_grace_s": 3}, tmp_path)
        p = ControlPlane(cluster_from_spec_dict(spec), cfg, fake_gpus(8), tmp_path / "data")
        p.start()
        made.append(p)
        return p

    yield make
    for p in made:
        p.close(kill_jobs=True)


def _states(p: ControlPlane) -> dict[str, int]:
    with p.store.reader() as r:
        return r.counts()


def test_sixty_six_jobs_on_eight_gpus(plane: Callable[[dict[str, Any]], ControlPlane]) -> None:
    p = plane(node_spec(fake_gpus(8)))
    ids = [p.submit(_req("sleep", "0.3"), ADMIN).job_id for _ in range(66)]
    assert len(set(ids)) == 66
    until(lambda: _states(p).get(st.DONE, 0) == 66, 90, "66 jobs done")
    runs = joblogs.runs(p.data_dir, node="local-0")
    assert {r.job for r in runs} == set(ids)
    assert joblogs.max_per_device(runs) == 1  # from the processes' own clocks
    assert {r.device for r in runs} == {str(i) for i in range(8)}
    with p.store.reader() as r:
        assert all(len(r.attempts(j)) == 1 for j in ids)


def _events(p: ControlPlane, job_id: str) -> list[tuple[str, str, str]]:
    return [(e["kind"], e["reason"], e["message"]) for e in p.events(ADMIN, job_id=job_id)]


@pytest.mark.parametrize("acks", [True, False], ids=["ack", "no-ack"])
def test_preemption_handshake(plane: Callable[[dict[str, Any]], ControlPlane], acks: bool) -> None:
    spec = fenced_spec(fake_gpus(8))
    spec["partitions"]["serving"]["preemption"]["grace_s"] = 1.5
    p = plane(spec)
    if acks:
        victim = _req("train", "--steps", "400", "--step-s", "0.05", gpus=4, checkpointable=True)
    else:  # handles the notice signal (so it is not killed by it) but never acknowledges
        code = (
            "import signal,time; signal.signal(signal.SIGUSR1, lambda *a: None);"
            "print('ready', flush=True); time.sleep(60)"
        )
        victim = SubmitRequest(command=[sys.executable, "-c", code], gpus=4, checkpointable=True)
    train = p.submit(victim, ADMIN).job_id
    serving = [p.submit(_req("serve", **{"class": "serving"}), ADMIN).job_id for _ in range(2)]
    until(lambda: _states(p).get(st.RUNNING, 0) == 3, 20, "training and serving running")
    # the victim has its notice handler in place (real policies give min_runtime_s for this)
    marker = '"resume"' if acks else "ready"
    log = p.log_path(train, 1)
    until(lambda: log.exists() and marker in log.read_text(), 20, "the victim's handler")
    surge = p.submit(_req("serve", "--seconds", "1", **{"class": "serving"}), ADMIN).job_id
    until(lambda: (j := p.job(surge, ADMIN)) is not None and j.state == st.DONE, 30, "surge")
    kinds = [k for k, _r, _m in _events(p, train)]
    assert kinds[:2] == ["submitted", "bind"]
    assert "notice" in kinds and "stop" in kinds and "requeue" in kinds
    stop_msg = next(m for k, _r, m in _events(p, train) if k == "stop")
    if acks:
        assert "checkpoint-ack" in kinds
        assert stop_msg == "checkpoint acknowledged"
    else:
        assert "checkpoint-ack" not in kinds
        assert "grace period expired" in stop_msg
    # the victim comes back as attempt 2 once the surge is over
    until(lambda: len(p.attempts(train)) == 2, 20, "attempt 2 of the preempted job")
    if acks:
        until(lambda: (j := p.job(train, ADMIN)) is not None and j.state == st.DONE, 60, "done")
        resumed = [
            json.loads(line)
            for line in p.log_path(train, 2).read_text().splitlines()
            if '"resume"' in line
        ]
        assert resumed and resumed[0]["step"] > 0, "attempt 2 resumed from the checkpoint"
        assert resumed[0]["attempt"] == 2
    surge_bind = next(m for k, _r, m in _events(p, surge) if k == "bind")
    assert surge_bind.startswith("training")  # ran on the capacity the preemption freed
    for s in serving:
        p.cancel(s, ADMIN)
    runs = joblogs.runs(p.data_dir, node="local-0")
    assert joblogs.max_per_device(runs) == 1


# ---------------------------------------------------------------------- kill -9 and restart
def _up(data: Path) -> subprocess.Popen[bytes]:
    (data / "server.json").unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "gpufence", "up", "--fake-gpus", "4", "--data", str(data)]
    log = open(data.parent / f"server-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([*cmd, "--port", "0"], stdout=log, stderr=subprocess.STDOUT)
    until(lambda: (data / "server.json").exists() or proc.poll() is not None, 30, "server up")
    assert proc.poll() is None, "server exited at start"
    return proc


# when to kill -9 the server: (what to wait for, seconds it stays down), in order
KILL_PLANS = {
    "mid-run": [("4 running", 2.0)],  # the running jobs finish while it is down
    "right-after-submit": [("nothing", 0.2)],  # binds may be persisted but not yet spawned
    "twice": [("4 running", 0.3), ("0.7 s", 1.0)],  # a restart that is itself killed
}


@pytest.mark.parametrize("plan", list(KILL_PLANS))
def test_kill_9_loses_no_job_and_runs_no_attempt_twice(tmp_path: Path, plan: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    server = _up(data)
    try:
        client = Client(data_dir=data)
        ids = [
            client.submit({"command": [*JOB, "sleep", "1.5"], "gpus": 1})["id"] for _ in range(10)
        ]
        for wait_for, down_s in KILL_PLANS[plan]:
            if wait_for == "4 running":
                now = client  # the client of the server running now

                def four_running(c: Client = now) -> bool:
                    return sum(j["state"] == "running" for j in c.jobs()) == 4

                until(four_running, 20, "4 jobs running")
            elif wait_for == "0.7 s":
                time.sleep(0.7)
            os.kill(server.pid, signal.SIGKILL)  # no shutdown code runs
            server.wait(10)
            time.sleep(down_s)
            server = _up(data)
            client = Client(data_dir=data)
        until(
            lambda: all(j["state"] == "done" for j in client.jobs()),
            60,
            "all jobs done after restart",
        )
        jobs = client.jobs()
        assert sorted(j["id"] for j in jobs) == sorted(ids)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(20)
    runs = joblogs.runs(data, node="local-0")
    per_attempt: dict[tuple[str, int], int] = {}
    for r in runs:
        per_attempt[(r.job, r.attempt)] = per_attempt.get((r.job, r.attempt), 0) + 1
    assert all(n == 1 for n in per_attempt.values()), "an attempt ran twice"
    assert {r.job for r in runs} == set(ids)
    assert joblogs.max_per_device(runs) == 1
    # each job completed exactly once: one attempt with an end line of code 0
    ends = {}
    for out in data.glob("jobs/*/attempt-*/rank-0.out"):
        for line in out.read_text().splitlines():
            ev = json.loads(line)
            if ev["ev"] == "end" and ev["code"] == 0:
                ends[ev["job"]] = ends.get(ev["job"], 0) + 1
    assert ends == {j: 1 for j in ids}


def test_fair_share_history_survives_a_restart(tmp_path: Path) -> None:
    """Usage is saved at a clean stop and handed back to the scheduler by the next start; a
    restart must not forgive a tenant the GPU-hours it just used."""
    cfg = control_config({"activity_interval_s": 0.2}, tmp_path)

    def usage(p: ControlPlane) -> dict[str, float]:
        got: dict[str, float] = p.reconciler.call(lambda r: r.scheduler.fair_share_usage()).result(
            10
        )
        return got

    spec = node_spec(fake_gpus(8))
    p = ControlPlane(cluster_from_spec_dict(spec), cfg, fake_gpus(8), tmp_path / "data")
    p.start()
    try:
        jid = p.submit(_req("sleep", "1"), ADMIN).job_id
        until(lambda: _states(p).get(st.DONE, 0) == 1, 30, f"{jid} done")
        before = usage(p)
        assert sum(before.values()) >= 1000 * 0.9  # ~1 GPU for ~1 s, in milli-GPU-seconds
    finally:
        p.close(kill_jobs=True)
    with st.Store(tmp_path / "data").reader() as r:
        saved = r.usage()
    assert saved is not None and saved[0] == pytest.approx(before, rel=1e-3)
    p2 = ControlPlane(cluster_from_spec_dict(spec), cfg, fake_gpus(8), tmp_path / "data")
    p2.start()
    try:
        after = usage(p2)  # a day's half-life: a few seconds of decay change nothing visible
        assert after == pytest.approx(before, rel=1e-3)
    finally:
        p2.close(kill_jobs=True)
