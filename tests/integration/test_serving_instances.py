"""Serving deployments have their own noun (issue 32, item 4), through the CLI and a real
server on 127.0.0.1: ``--class serving --instances N --name D`` makes N jobs, each a replica of
its own (placed and stopped one by one), and ``gpufence_serving_replicas`` and the dashboard's
series (``GET /v1/series``) count N; ``--replicas`` stays a gang's size, refused for serving
with a message naming ``--instances``.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_server import Cli, CliServer, cli_for, cli_server
from prometheus_client.parser import text_string_to_metric_families

from gpufence.control.gpus.discovery import fake_gpus
from gpufence.demo.live import fenced_spec
from gpufence.testing.waiting import until_value

ADMIN = "serving-instances-admin-token-0123456789"
PY = sys.executable


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliServer]:
    spec = fenced_spec(fake_gpus(8))  # serving: GPUs 0-1
    spec["control"] = {
        "auth": {"admin_token": ADMIN},
        "stop_grace_s": 1,
        "telemetry": {"series_step_s": 0.2},
    }
    yield from cli_server(tmp_path_factory.mktemp("serving"), spec, ADMIN)


@pytest.fixture
def cli(server: CliServer) -> Cli:
    return cli_for(server, ADMIN)


def get(srv: CliServer, path: str) -> str:
    req = urllib.request.Request(srv.url + path, headers={"Authorization": f"Bearer {ADMIN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return str(r.read().decode())


def replicas_metric(srv: CliServer, deployment: str) -> float | None:
    for fam in text_string_to_metric_families(get(srv, "/metrics")):
        for s in fam.samples:
            if s.name == "gpufence_serving_replicas" and s.labels["deployment"] == deployment:
                return float(s.value)
    return None


def replicas_series(srv: CliServer, deployment: str) -> int | None:
    for d in json.loads(get(srv, "/v1/series"))["serving"]:
        if d["deployment"] == deployment:
            last: int | None = d["replicas"][-1]
            return last
    return None


def test_instances_are_replicas_each_a_job(cli: Cli, server: CliServer, tmp_path: Path) -> None:
    go = tmp_path / "go"
    wait = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
    r = cli(
        "submit", "--class", "serving", "--instances", "2", "--name", "chat", "--", PY, "-c", wait
    )
    assert r.exit_code == 0, r.output
    ids = r.stdout.split()
    assert len(ids) == 2, r.output
    for jid in ids:
        job = until_value(
            lambda j=jid: server.client.job(j), lambda j: j["state"] == "running", 30, jid
        )
        assert job["spec"]["replicas"] == 1 and job["name"] == "chat", job
    until_value(lambda: replicas_metric(server, "chat"), lambda v: v == 2.0, 30, "2 replicas")
    until_value(lambda: replicas_series(server, "chat"), lambda v: v == 2, 30, "2 in the series")
    # each scales on its own: one stopped, the other serves on
    assert cli("cancel", ids[0]).exit_code == 0
    until_value(lambda: replicas_metric(server, "chat"), lambda v: v == 1.0, 30, "1 replica")
    assert server.client.job(ids[1])["state"] == "running"
    go.touch()


def test_serving_replicas_is_refused_naming_instances(cli: Cli) -> None:
    r = cli("submit", "--class", "serving", "--replicas", "2", "--name", "chat2", "--", "true")
    assert r.exit_code == 2 and "--instances 2" in r.output, r.output
    r = cli("submit", "--instances", "2", "--name", "x", "--", "true")
    assert r.exit_code == 2 and "--class serving" in r.output, r.output
    r = cli("submit", "--class", "serving", "--instances", "2", "--", "true")
    assert r.exit_code == 2 and "--name" in r.output, r.output


def test_a_gang_keeps_its_replicas(cli: Cli, server: CliServer) -> None:
    r = cli("submit", "--replicas", "2", "--", "true")
    assert r.exit_code == 0, r.output
    job: dict[str, Any] = server.client.job(r.stdout.strip())
    assert job["spec"]["replicas"] == 2
