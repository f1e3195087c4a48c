"""``--cpus`` / ``--mem`` / ``--time-limit`` end to end on a real server (127.0.0.1, real
processes): into the core ``Job`` and the executor's ``Launch.limits``, placed against this
machine's real CPU count, and the ``oom`` / ``time-limit`` end reasons in ``gpufence status``.

Enforcement (the cgroup that OOM-kills, caps CPU, and the report of ``AttemptExit.oom``) is the
executor's; here an executor wrapper flags one job's exit as an OOM kill, the way the contained
executor reports it, to show what the control plane does with that report.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufence.cli.main import app
from gpufence.control.base.config import SERVER_FILE, load_config
from gpufence.control.base.executor import (
    AckCallback,
    AttemptExit,
    ExitCallback,
    Launch,
    Limits,
)
from gpufence.control.executors.local.local_executor import LocalExecutor
from gpufence.control.gpus.discovery import fake_gpus
from gpufence.control.gpus.nodespec import host_cpu_cores, host_memory_gib, host_resources
from gpufence.control.http.server import build_plane, serve
from gpufence.control.plane import ControlPlane

ADMIN = "admin-token-0123456789"
MIB = 1 << 20
CONFIG = f"""
name: limits
node_groups:
  - {{name: box, count: 1, gpus_per_node: 2, gpu_type: H100-80GB}}   # no cpu_cores/memory_gib
partitions:
  shared: {{nodes: [box], admits: [training, batch], sharing: exclusive}}
control:
  auth: {{admin_token: "{ADMIN}"}}
  job_pids_limit: 777
  stop_grace_s: 1
"""
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


class FlaggingExecutor(LocalExecutor):
    """The local executor, recording every Launch and reporting the exits of ``oom_jobs`` as
    OOM kills (what the contained executor says when the memory limit's OOM killer struck)."""

    def __init__(self) -> None:
        super().__init__()
        self.launches: list[Launch] = []
        self.oom_jobs: set[str] = set()

    def set_callbacks(self, on_exit: ExitCallback, on_ack: AckCallback) -> None:
        def flagged(ev: AttemptExit) -> None:
            on_exit(dataclasses.replace(ev, oom=True) if ev.job_id in self.oom_jobs else ev)

        super().set_callbacks(flagged, on_ack)

    def start(self, launch: Launch) -> None:
        self.launches.append(launch)
        super().start(launch)


def _serve(plane: ControlPlane, data: Path) -> Iterator[str]:
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=serve,
        args=(plane, "127.0.0.1", 0, ready, stop),
        kwargs={"kill_jobs": True, "log_level": "warning"},
        daemon=True,
    )
    thread.start()
    assert ready.wait(30), "server did not start"
    yield json.loads((data / SERVER_FILE).read_text())["url"]
    stop.set()
    thread.join(30)


@pytest.fixture(scope="module")
def flagging(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, FlaggingExecutor]]:
    root = tmp_path_factory.mktemp("limits")
    (root / "c.yaml").write_text(CONFIG)
    data = root / "data"
    cluster, cc = load_config(root / "c.yaml", data, host_resources())
    ex = FlaggingExecutor()
    plane = ControlPlane(cluster, cc, fake_gpus(2), data, executor=ex)
    for url in _serve(plane, data):
        yield url, ex


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ControlPlane]]:
    """The server exactly as ``gpufence up --config`` builds it (build_plane)."""
    root = tmp_path_factory.mktemp("built")
    (root / "c.yaml").write_text(CONFIG)
    data = root / "data"
    plane = build_plane(root / "c.yaml", data, 2, "H100-80GB")
    for url in _serve(plane, data):
        yield url, plane


def call(url: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"}
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait(url: str, job: str, pred: Callable[[dict[str, Any]], bool], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        _, j = call(url, "GET", f"/v1/jobs/{job}")
        if pred(j):
            return j
        assert time.monotonic() < deadline, f"{job}: {j}"
        time.sleep(0.05)


def test_limits_reach_the_core_job_and_the_launch(
    flagging: tuple[str, FlaggingExecutor], built: tuple[str, ControlPlane]
) -> None:
    url, ex = flagging
    body = {"command": ["true"], "cpus": 1.5, "mem_bytes": 256 * MIB, "time_limit_s": 30}
    status, out = call(url, "POST", "/v1/jobs", body)
    assert status == 201, out
    wait(url, out["id"], lambda j: j["state"] == "done")
    (launch,) = [la for la in ex.launches if la.job_id == out["id"]]
    assert launch.limits == Limits(cpus=1.5, mem_bytes=256 * MIB, pids=777, log_bytes=1 << 30)
    assert launch.run_as is None, "no run_as configured: the server's own user"
    # the core's Job (the scheduler of an identical server keeps it while it runs)
    burl, plane = built
    status, out = call(burl, "POST", "/v1/jobs", {**body, "command": SLEEP})
    assert status == 201, out
    try:
        job = plane.scheduler.job(out["id"]).job
        assert (job.cpu_milli, job.mem_mib, job.time_limit_s) == (1500, 256, 30)
    finally:
        call(burl, "POST", f"/v1/jobs/{out['id']}/cancel")
        wait(burl, out["id"], lambda j: j["state"] == "cancelled")


@pytest.mark.parametrize(("gpus", "share"), [(1, 0.5), (2, 1.0)])
def test_a_job_naming_no_limits_gets_its_gpus_share_of_the_node(
    flagging: tuple[str, FlaggingExecutor], gpus: int, share: float
) -> None:
    """No --cpus / --mem: the member is still limited, to its node's cores and memory in
    proportion to the GPUs it holds (the node has 2)."""
    url, ex = flagging
    status, out = call(url, "POST", "/v1/jobs", {"command": ["true"], "gpus": gpus})
    assert status == 201, out
    wait(url, out["id"], lambda j: j["state"] == "done")
    (launch,) = [la for la in ex.launches if la.job_id == out["id"]]
    cores, mem_gib = host_cpu_cores(), host_memory_gib()
    assert launch.limits.cpus == max(round(cores * share, 3), 0.1)
    assert launch.limits.mem_bytes == int(mem_gib * 1024 * MIB * share)


def test_cpus_and_memory_are_placed_against_this_machines(built: tuple[str, ControlPlane]) -> None:
    """The config leaves cpu_cores/memory_gib out: the node has this machine's (not the spec's
    defaults of 64 cores / 512 GiB), so requests beyond them are refused and the node fills."""
    url, plane = built
    cores, mem_gib = host_cpu_cores(), host_memory_gib()
    assert cores is not None and mem_gib is not None
    (node,) = plane.cluster.nodes
    assert (node.cpu_milli, node.mem_mib) == (cores * 1000, mem_gib * 1024)

    status, out = call(url, "POST", "/v1/jobs", {"command": ["true"], "cpus": cores + 1})
    assert status == 422 and out["field"] == "body.cpus", out
    assert out["type"] == "urn:gpufence:problem:rejected" and out["reason"] == "never-fits"
    big = (mem_gib + 1) << 30
    status, out = call(url, "POST", "/v1/jobs", {"command": ["true"], "mem_bytes": big})
    assert status == 422 and out["field"] == "body.mem_bytes", out

    status, first = call(url, "POST", "/v1/jobs", {"command": SLEEP, "cpus": cores})
    assert status == 201
    try:
        wait(url, first["id"], lambda j: j["state"] == "running")
        status, second = call(url, "POST", "/v1/jobs", {"command": SLEEP, "cpus": 1})
        # a GPU is free but no CPU: it waits (the core words it as "fragmented" for now)
        assert status == 201 and second["state"] == "pending", second
    finally:
        for j in (first, second):
            call(url, "POST", f"/v1/jobs/{j['id']}/cancel")
    wait(url, second["id"], lambda j: j["state"] == "cancelled")


def test_an_oom_kill_ends_the_job_failed_with_reason_oom(
    flagging: tuple[str, FlaggingExecutor],
) -> None:
    url, ex = flagging
    # dies of SIGKILL, as a process the OOM killer picks does; the executor says it was that
    code = "import os, signal, time; time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)"
    body = {"command": [sys.executable, "-c", code], "mem_bytes": 64 * MIB}
    status, out = call(url, "POST", "/v1/jobs", body)
    assert status == 201
    ex.oom_jobs.add(out["id"])
    job = wait(url, out["id"], lambda j: j["state"] == "failed")
    assert job["reason"] == "oom"
    assert "killed by the out-of-memory killer (over its memory limit of 64 MiB)" in job["message"]
    res = CliRunner().invoke(app, ["status", out["id"], "--url", url, "--token", ADMIN])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert "failure oom: killed by the out-of-memory killer (over its memory limit of 64M)" in flat
    assert "64M memory" in res.output


def test_a_job_over_its_time_limit_ends_with_reason_time_limit(
    flagging: tuple[str, FlaggingExecutor],
) -> None:
    url, _ex = flagging
    status, out = call(url, "POST", "/v1/jobs", {"command": SLEEP, "time_limit_s": 2})
    assert status == 201
    t0 = time.monotonic()
    job = wait(url, out["id"], lambda j: j["state"] in ("failed", "done", "cancelled"), 15)
    assert job["state"] == "failed" and job["reason"] == "time-limit", job
    assert time.monotonic() - t0 < 8
    res = CliRunner().invoke(app, ["status", out["id"], "--url", url, "--token", ADMIN])
    assert "time-limit" in res.output


def test_cli_submit_takes_sizes_and_durations(flagging: tuple[str, FlaggingExecutor]) -> None:
    url, _ex = flagging
    runner = CliRunner()
    base = ["submit", "--url", url, "--token", ADMIN]
    limits = ["--cpus", "1", "--mem", "64M", "--time-limit", "1h"]
    res = runner.invoke(app, [*base, *limits, "--", "true"])
    assert res.exit_code == 0, res.output
    job = res.output.strip().splitlines()[0]
    _, j = call(url, "GET", f"/v1/jobs/{job}")
    assert (j["spec"]["cpus"], j["spec"]["mem_bytes"], j["spec"]["time_limit_s"]) == (
        1.0,
        64 * MIB,
        3600.0,
    )
    shown = runner.invoke(app, ["status", job, "--url", url, "--token", ADMIN]).output
    assert "1 CPU, 64M memory, time limit 1h" in shown
    bad = runner.invoke(app, [*base, "--mem", "64", "--", "true"])
    assert bad.exit_code == 2 and "--mem" in bad.output and "64M" in bad.output
    bad = runner.invoke(app, [*base, "--time-limit", "soon", "--", "true"])
    assert bad.exit_code == 2 and "--time-limit" in bad.output
    bad = runner.invoke(app, [*base, "--cpus", "0", "--", "true"])
    assert bad.exit_code == 2 and "cpus" in bad.output
