"""Issue 32, case 10, through the CLI and a real server on 127.0.0.1 (4 fake GPUs, one
partition, real processes): what ``--wait`` says about a failed job, ``queue -o json``'s
``gpus``, the fair-share table's units and the GPU map's GPUs held for a
waiting gang."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from cli_server import Cli, CliServer, cli_for, cli_server

from gpufence.control.gpus.discovery import fake_gpus, node_spec
from gpufence.testing.waiting import until_value

ADMIN = "small-fixes-admin-token-0123456789"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliServer]:
    spec = node_spec(fake_gpus(4))
    spec["control"] = {"auth": {"admin_token": ADMIN}, "stop_grace_s": 1}
    yield from cli_server(tmp_path_factory.mktemp("small-fixes"), spec, ADMIN)


@pytest.fixture
def cli(server: CliServer) -> Cli:
    return cli_for(server, ADMIN)


def _running(server: CliServer, jid: str) -> dict[str, Any]:
    return until_value(
        lambda: server.client.job(jid), lambda j: j["state"] == "running", 60, f"{jid} running"
    )


def test_wait_on_a_failed_job_says_how_it_ended(cli: Cli) -> None:
    boom = (
        "import sys; print('fine so far'); "
        "sys.stderr.write('ValueError: bad shard 7\\n'); sys.exit(4)"
    )
    r = cli("submit", "--wait", "--", sys.executable, "-c", boom)
    assert r.exit_code == 4, r.output
    jid = r.stdout.split()[0]
    assert f"{jid}: exit code 4: ValueError: bad shard 7" in r.stderr, r.stderr


def test_queue_json_gives_gpus_as_numbers(cli: Cli, server: CliServer) -> None:
    jid = server.client.submit(
        {"command": ["sleep", "30"], "gpus": 2, "replicas": 2, "hold": True}
    )["id"]
    try:
        r = cli("queue", "-o", "json")
        assert r.exit_code == 0, r.output
        job = next(j for j in json.loads(r.stdout)["jobs"] if j["id"] == jid)
        assert (job["gpus"], job["replicas"], job["gpus_total"]) == (2, 2, 4), job
        assert job["request"] == "2x 2 GPUs"
    finally:
        server.client.cancel(jid)


def test_fair_share_is_in_gpus_like_the_gpus_held_beside_it(cli: Cli, server: CliServer) -> None:
    running = server.client.submit({"command": ["sleep", "60"], "gpus": 3})["id"]
    waiting = server.client.submit({"command": ["sleep", "1"], "gpus": 4})["id"]
    try:
        _running(server, running)
        r = cli("explain", waiting, "-o", "json")
        assert r.exit_code == 0, r.output
        rows = json.loads(r.stdout)["fair_share"]
        held = next(t for t in rows if t["holding_gpus"] > 0)
        assert held["holding_gpus"] == 3
        # 3 GPUs held at weight 1 (plus seconds of decayed usage): 3, not 3000 milli-GPUs
        assert 3.0 <= held["share"] < 3.1, held
        assert "share 3000" not in r.stdout
    finally:
        server.client.cancel(waiting)
        server.client.cancel(running)


def test_gpu_map_shows_the_gpus_held_for_a_waiting_gang(cli: Cli, server: CliServer) -> None:
    running = server.client.submit({"command": ["sleep", "60"], "gpus": 1, "est_runtime_s": 60})[
        "id"
    ]
    gang = server.client.submit({"command": ["sleep", "1"], "gpus": 1, "replicas": 4})["id"]
    try:
        _running(server, running)
        nodes = until_value(
            server.client.nodes,
            lambda ns: any(g["state"] == "held" for n in ns for g in n["gpus"]),
            30,
            "GPUs held for the gang",
        )
        held = [g for n in nodes for g in n["gpus"] if g["state"] == "held"]
        assert len(held) == 3 and {g["held_for"] for g in held} == {gang}, nodes
        r = cli("top", "--once")
        assert r.exit_code == 0, r.output
        assert r.stdout.count(f":held:{gang}]") == 3, r.stdout
        r = cli("nodes")
        assert r.stdout.count(f"held for {gang}'s gang") == 3, r.stdout
    finally:
        server.client.cancel(gang)
        server.client.cancel(running)
