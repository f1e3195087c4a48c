"""CPU-only steps (``--gpus 0``) through the CLI and a real server on 127.0.0.1: a job that
holds no GPU, placed by its CPU (one core unless it asks for more) on a node with room, never
more of them at once than the node's cores, and the shipped job file's prep and report steps
run as such. The machine is declared with 2 cores so the test is the same on any host.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_server import Cli, CliServer, cli_for, cli_server

from gpufence.cli.examples_verb import examples_dir
from gpufence.control.gpus.discovery import fake_gpus
from gpufence.demo.live import fenced_spec
from gpufence.testing.waiting import until_value

ADMIN = "cpu-only-admin-token-0123456789"
PY = sys.executable
CORES = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliServer]:
    spec = fenced_spec(fake_gpus(8))
    spec["node_groups"][0]["cpu_cores"] = CORES
    spec["control"] = {"auth": {"admin_token": ADMIN}, "stop_grace_s": 1}
    yield from cli_server(tmp_path_factory.mktemp("cpu-only"), spec, ADMIN)


@pytest.fixture
def cli(server: CliServer) -> Cli:
    return cli_for(server, ADMIN)


def submit(cli: Cli, *args: str) -> str:
    r = cli("submit", *args)
    assert r.exit_code == 0, r.output
    return str(r.stdout).strip().splitlines()[0]


def job_when(srv: CliServer, jid: str, what: str, ok: Any) -> dict[str, Any]:
    return until_value(lambda: srv.client.job(jid), ok, 30, f"{jid} {what}")


def test_a_cpu_only_job_holds_no_gpu_and_one_core(cli: Cli, server: CliServer) -> None:
    jid = submit(
        cli,
        "--gpus",
        "0",
        "--",
        PY,
        "-c",
        "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))",
    )
    job = job_when(server, jid, "ended", lambda j: j["ended_at"] is not None)
    assert job["state"] == "done", job
    assert job["spec"]["cpus"] == 1.0  # the default core, stored as the job holds it
    assert [a["gpus"] for a in job["attempts"][0]["assignments"]] == [[]]
    assert server.client.logs(jid).body.decode().strip() == "''"


def test_cpu_only_jobs_never_oversubscribe_the_cores(
    cli: Cli, server: CliServer, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    wait = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
    running = [submit(cli, "--gpus", "0", "--", PY, "-c", wait) for _ in range(CORES)]
    for jid in running:
        job_when(server, jid, "running", lambda j: j["state"] == "running")
    third = submit(cli, "--gpus", "0", "--", PY, "-c", wait)
    gpu_job = submit(cli, "--gpus", "1", "--", PY, "-c", wait)  # GPUs are still free
    job_when(server, gpu_job, "running", lambda j: j["state"] == "running")
    pending = job_when(
        server,
        third,
        "pending on CPU",
        lambda j: (j.get("pending") or {}).get("reason") not in (None, "queued"),
    )
    assert pending["state"] == "pending", pending
    assert pending["pending"]["reason"] == "no-fit", pending
    assert "1 CPU" in pending["pending"]["message"], pending
    r = cli("submit", "--gpus", "0", "--cpus", str(CORES + 1), "--", "true")
    assert r.exit_code == 1 and "CPU" in r.output, r.output  # never fits: rejected
    go.touch()
    for jid in [*running, third, gpu_job]:
        done = job_when(server, jid, "ended", lambda j: j["ended_at"] is not None)
        assert done["state"] == "done", done


def test_negative_gpus_is_an_error_naming_the_flag(cli: Cli) -> None:
    r = cli("submit", "--gpus", "-1", "--", "true")
    assert r.exit_code == 2 and "--gpus" in r.output, r.output


def test_the_shipped_sweep_runs_prep_and_report_without_a_gpu(
    cli: Cli, server: CliServer, tmp_path: Path
) -> None:
    r = cli("submit", "-f", str(examples_dir() / "jobs-sweep.yaml"), "--wait")
    assert r.exit_code == 0, r.output
    by_name = {n: server.client.named(n) for n in ("sweep-prep", "sweep-report")}
    for name, jobs in by_name.items():
        job = server.client.job(jobs[0]["id"])
        assert len(jobs) == 1 and job["state"] == "done", (name, job)
        assert [a["gpus"] for a in job["attempts"][0]["assignments"]] == [[]], (name, job)
