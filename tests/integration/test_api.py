"""The HTTP API and the CLI verbs against a real server on 127.0.0.1 (8 fake GPUs, real processes).

One server for the module: ``serve`` in a thread on port 0 with a tmp data dir and a config whose
``control.auth`` has an admin token and two tenants. Jobs are short ``python -c`` commands.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from typer.testing import CliRunner

from gpufence.cli.main import app
from gpufence.control.config import SERVER_FILE
from gpufence.control.http.server import build_plane, serve
from gpufence.control.plane import ControlPlane
from gpufence.testing.waiting import until, until_value

ADMIN = "admin-token-0123456789"
TOKEN_A = "tenant-a-token-0123"
TOKEN_B = "tenant-b-token-0123"

CONFIG = f"""
name: api-test
node_groups:
  - name: h100
    count: 1
    gpus_per_node: 8
    gpu_type: H100-80GB
    nvlink_domains: [8]
partitions:
  shared:
    nodes: [h100]
    admits: [serving, training, interactive, batch]
    sharing: exclusive
control:
  auth:
    admin_token: "{ADMIN}"
    tenants:
      team-a: {{token: "{TOKEN_A}"}}
      team-b: {{token: "{TOKEN_B}"}}
  stop_grace_s: 2
"""

PRINT_DEVICES = [
    sys.executable,
    "-c",
    "import os; print('devices=' + os.environ['CUDA_VISIBLE_DEVICES'])",
]
# writes its pid to $PIDFILE, then sleeps: lets a test check that cancel really ends the process
SLEEPER = [
    sys.executable,
    "-c",
    "import os, time; open(os.environ['PIDFILE'], 'w').write(str(os.getpid())); time.sleep(30)",
]


@dataclass
class Server:
    url: str
    data: Path
    plane: ControlPlane


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("api")
    cfg = root / "cluster.yaml"
    cfg.write_text(CONFIG, encoding="utf-8")
    data = root / "data"
    plane = build_plane(cfg, data, 8, "H100-80GB")
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=serve,
        args=(plane, "127.0.0.1", 0, ready, stop),
        kwargs={"kill_jobs": True, "log_level": "warning"},
        daemon=True,
    )
    thread.start()
    assert ready.wait(30), "server did not start"
    info = json.loads((data / SERVER_FILE).read_text())
    assert info["pid"] == os.getpid()
    assert info["url"].startswith("http://127.0.0.1:") and not info["url"].endswith(":0")
    yield Server(info["url"], data, plane)
    stop.set()
    thread.join(30)
    assert not thread.is_alive()
    assert not (data / SERVER_FILE).exists(), "server.json is removed at shutdown"


def call(
    srv: Server,
    method: str,
    path: str,
    token: str | None = ADMIN,
    body: Any = None,
) -> tuple[int, Any, Any]:
    """(status, parsed JSON or text, headers)."""
    headers = {}
    data = None
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(srv.url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, raw, hdrs = resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        status, raw, hdrs = exc.code, exc.read(), exc.headers
    ctype = hdrs.get("content-type", "")
    return status, json.loads(raw) if "json" in ctype else raw.decode(), hdrs


def wait_state(srv: Server, job_id: str, states: tuple[str, ...], timeout: float = 20.0) -> Any:
    def read() -> Any:
        status, job, _ = call(srv, "GET", f"/v1/jobs/{job_id}")
        assert status == 200, job
        return job

    return until_value(read, lambda job: job["state"] in states, timeout, f"{job_id} in {states}")


def submit(srv: Server, body: dict[str, Any], token: str = ADMIN) -> tuple[int, Any]:
    status, out, _ = call(srv, "POST", "/v1/jobs", token, body)
    return status, out


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# ------------------------------------------------------------------------------------- jobs


def test_submit_runs_to_done_with_its_devices_in_the_log(server: Server) -> None:
    status, res = submit(server, {"command": PRINT_DEVICES, "gpus": 2, "name": "hello"})
    assert status == 201, res
    assert set(res) == {"id", "state", "reason", "message"}
    job = wait_state(server, res["id"], ("done", "failed"))
    assert job["state"] == "done" and job["exit_code"] == 0, job
    assert job["name"] == "hello" and job["tenant"] == "admin" and job["gpus"] == "2 GPUs"
    (att,) = job["attempts"]
    devices = att["devices"][0]
    assert len(devices) == 2 and att["exit_codes"] == [0]
    status, text, headers = call(server, "GET", f"/v1/jobs/{res['id']}/logs")
    assert status == 200
    assert f"devices={','.join(devices)}" in text
    assert int(headers["X-Log-Offset"]) == len(text.encode())
    assert headers["X-Job-State"] == "done"
    # following from the end returns nothing new
    end = headers["X-Log-Offset"]
    status, text, headers = call(server, "GET", f"/v1/jobs/{res['id']}/logs?offset={end}")
    assert status == 200 and text == "" and headers["X-Log-Offset"] == end
    status, ev, _ = call(server, "GET", f"/v1/events?job={res['id']}")
    kinds = [e["kind"] for e in ev["events"]]
    assert kinds[0] == "submitted" and "bind" in kinds and "exited" in kinds


def test_auth_401_without_or_with_a_bad_token(server: Server) -> None:
    for token in (None, "not-a-token-at-all", "naïve-tökén"):
        status, body, headers = call(server, "GET", "/v1/jobs", token=token)
        assert status == 401, body
        assert headers["WWW-Authenticate"] == "Bearer"
    assert submit(server, {"command": ["true"]}, token="wrong-token-1234")[0] == 401
    # open endpoints
    assert call(server, "GET", "/healthz", token=None)[0] == 200
    assert call(server, "GET", "/metrics", token=None)[0] == 200


def test_tenants_see_and_cancel_only_their_own_jobs(server: Server) -> None:
    status, a = submit(server, {"command": ["true"]}, token=TOKEN_A)
    assert status == 201
    status, b = submit(server, {"command": ["true"]}, token=TOKEN_B)
    assert status == 201
    assert call(server, "GET", f"/v1/jobs/{a['id']}", token=TOKEN_B)[0] == 403
    assert call(server, "POST", f"/v1/jobs/{a['id']}/cancel", token=TOKEN_B)[0] == 403
    assert call(server, "GET", f"/v1/jobs/{a['id']}/logs", token=TOKEN_B)[0] == 403
    assert call(server, "GET", f"/v1/jobs/{a['id']}/explain", token=TOKEN_B)[0] == 403
    assert call(server, "GET", f"/v1/events?job={a['id']}", token=TOKEN_B)[0] == 403
    assert call(server, "GET", "/v1/events", token=TOKEN_B)[0] == 403  # cluster log: admins
    assert call(server, "GET", f"/v1/jobs/{a['id']}", token=TOKEN_A)[0] == 200
    _, listed, _ = call(server, "GET", "/v1/jobs", token=TOKEN_B)
    assert {j["tenant"] for j in listed["jobs"]} == {"team-b"}
    assert b["id"] in {j["id"] for j in listed["jobs"]}
    assert call(server, "GET", "/v1/jobs?tenant=team-a", token=TOKEN_B)[0] == 403
    _, listed, _ = call(server, "GET", "/v1/jobs?tenant=team-a", token=ADMIN)
    assert {j["tenant"] for j in listed["jobs"]} == {"team-a"}
    # only the admin submits on behalf of another tenant
    status, body = submit(server, {"command": ["true"], "tenant": "team-a"}, token=TOKEN_B)
    assert status == 403, body
    status, body = submit(server, {"command": ["true"], "tenant": "team-a"}, token=ADMIN)
    assert status == 201
    assert call(server, "GET", f"/v1/jobs/{body['id']}", token=TOKEN_A)[0] == 200
    for jid in (a["id"], b["id"], body["id"]):
        assert wait_state(server, jid, ("done", "failed"))["state"] == "done"


def test_invalid_bodies_are_422_with_field_names(server: Server) -> None:
    cases = [
        ({"command": ["true"], "gpus": -1}, "gpus"),
        ({"command": ["true"], "bogus": 1}, "bogus"),
        ({"gpus": 1}, "command"),
        ({"command": []}, "command"),
        ({"command": ["true"], "class": "nope"}, "class"),
        ({"command": ["true"], "env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env"),
    ]
    for body, field in cases:
        status, out = submit(server, body)
        assert status == 422, (body, out)
        assert any(d["loc"][:2] == ["body", field] for d in out["detail"]), out
    status, out, _ = call(server, "GET", "/v1/jobs?state=nonsense")
    assert status == 422 and out["detail"][0]["loc"] == ["query", "state"]
    status, out, _ = call(server, "GET", "/v1/jobs/j1/logs?stream=both")
    assert status == 422


def test_jobs_no_partition_can_hold_are_rejected_at_submit(server: Server) -> None:
    for body, field, words in (
        ({"command": ["true"], "gpus": 9}, "gpus", "9 GPUs"),
        ({"command": ["true"], "mig": "1g.10gb"}, "mig", "MIG"),
        ({"command": ["true"], "partition": "nope"}, "partition", "does not exist"),
    ):
        status, out = submit(server, body)
        assert status == 422, out
        (d,) = out["detail"]
        assert d["type"] == "rejected" and d["loc"] == ["body", field], d
        assert words in d["msg"] and d["reason"] in ("never-fits", "invalid")
        job = out["job"]
        assert job["state"] == "rejected"
        # the row stays, so `status` can show it
        stored = call(server, "GET", f"/v1/jobs/{job['id']}")[1]
        assert stored["state"] == "rejected" and stored["message"] == d["msg"]


def test_unknown_job_is_404(server: Server) -> None:
    for method, path in (
        ("GET", "/v1/jobs/j999999"),
        ("POST", "/v1/jobs/j999999/cancel"),
        ("GET", "/v1/jobs/j999999/logs"),
        ("GET", "/v1/jobs/j999999/explain"),
        ("GET", "/v1/events?job=j999999"),
    ):
        status, body, _ = call(server, method, path)
        assert status == 404, (path, body)
        assert "j999999" in body["detail"]


def test_cancel_pending_and_running_jobs(server: Server, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    status, big = submit(server, {"command": SLEEPER, "gpus": 8, "env": {"PIDFILE": str(pidfile)}})
    assert status == 201
    wait_state(server, big["id"], ("running",))
    status, waiting = submit(server, {"command": ["true"], "gpus": 8})
    assert status == 201 and waiting["state"] == "pending", waiting
    # a pending job says why, in the job and in explain
    job = call(server, "GET", f"/v1/jobs/{waiting['id']}")[1]
    assert job["pending"]["reason"] and job["pending"]["message"]
    _, ex, _ = call(server, "GET", f"/v1/jobs/{waiting['id']}/explain")
    assert ex["state"] == "pending" and ex["pending"]["reason"]
    assert ex["fair_share"] and {"queue", "share", "rank"} <= set(ex["fair_share"][0])

    status, out, _ = call(server, "POST", f"/v1/jobs/{waiting['id']}/cancel")
    assert status == 200 and out == {"id": waiting["id"], "state": "cancelled"}
    assert wait_state(server, waiting["id"], ("cancelled",))["attempts"] == []

    until(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 10, "the job's pid")
    pid = int(pidfile.read_text())
    status, out, _ = call(server, "POST", f"/v1/jobs/{big['id']}/cancel")
    assert status == 200 and out["state"] in ("stopping", "cancelled")
    job = wait_state(server, big["id"], ("cancelled", "failed", "done"), timeout=15)
    assert job["state"] == "cancelled", job
    until(lambda: gone(pid), 5, f"process {pid} to end")
    # cancelling an ended job is a conflict
    status, out, _ = call(server, "POST", f"/v1/jobs/{big['id']}/cancel")
    assert status == 409 and "ended" in out["detail"]


# ---------------------------------------------------------------------------------- cluster


def test_metrics_are_prometheus_text(server: Server) -> None:
    status, text, headers = call(server, "GET", "/metrics", token=None)
    assert status == 200
    assert headers["content-type"] == CONTENT_TYPE_LATEST
    assert "gpufence_queue_delay_seconds" in text
    assert "gpufence_jobs" in text
    assert 'gpufence_partition_gpus{kind="capacity",partition="shared"} 8.0' in text


def test_nodes_and_partitions_shapes(server: Server) -> None:
    status, body, _ = call(server, "GET", "/v1/nodes", token=TOKEN_A)
    assert status == 200
    (node,) = body["nodes"]
    assert node["fake"] is True and node["up"] is True
    assert [g["index"] for g in node["gpus"]] == list(range(8))
    for g in node["gpus"]:
        assert g["partition"] == "shared" and g["type"] == "H100-80GB"
        assert g["state"] in ("free", "used") and isinstance(g["jobs"], list)
    status, body, _ = call(server, "GET", "/v1/partitions", token=TOKEN_A)
    assert status == 200
    (part,) = body["partitions"]
    assert part["name"] == "shared" and part["capacity_gpus"] == 8
    for key in ("used_gpus", "lent_gpus", "borrowed_gpus", "pending", "running", "largest_gang"):
        assert key in part


def test_openapi_is_versioned(server: Server) -> None:
    status, spec, _ = call(server, "GET", "/openapi.json", token=None)
    assert status == 200 and spec["info"]["title"] == "gpufence"
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/nodes", "/metrics"} <= set(spec["paths"])


# -------------------------------------------------------------------------------------- CLI


@pytest.fixture
def cli(server: Server) -> Iterator[Any]:
    runner = CliRunner()
    env = {"GPUFENCE_URL": server.url, "GPUFENCE_TOKEN": ADMIN, "GPUFENCE_DATA": None}

    def run(*args: str, **kw: Any) -> Any:
        return runner.invoke(app, list(args), env={**env, **kw.pop("env", {})}, **kw)

    yield run


def test_cli_submit_queue_status_logs(server: Server, cli: Any) -> None:
    r = cli(
        "submit",
        "--gpus",
        "1",
        "--name",
        "cli-job",
        "--env",
        "GREETING=hi",
        "--",
        sys.executable,
        "-c",
        "import os; print(os.environ['GREETING'], os.environ['CUDA_VISIBLE_DEVICES'])",
    )
    assert r.exit_code == 0, r.output
    jid = r.stdout.strip().splitlines()[0]
    assert jid.startswith("j")
    job = wait_state(server, jid, ("done", "failed"))
    assert job["state"] == "done", job
    assert job["spec"]["cwd"] == os.getcwd()
    r = cli("queue", "--all")
    assert r.exit_code == 0, r.output
    assert jid in r.stdout and "cli-job" in r.stdout
    r = cli("status", jid)
    assert r.exit_code == 0, r.output
    assert "done" in r.stdout and "attempts" in r.stdout
    assert f"r0:{job['attempts'][0]['devices'][0][0]}" in r.stdout
    r = cli("logs", jid)
    assert r.exit_code == 0 and r.stdout.startswith("hi "), r.output
    r = cli("logs", "-f", jid)  # an ended job: prints everything, returns
    assert r.exit_code == 0 and r.stdout.startswith("hi ")
    r = cli("explain", jid)
    assert r.exit_code == 0 and jid in r.stdout


def test_cli_reject_and_bad_input(server: Server, cli: Any) -> None:
    r = cli("submit", "--gpus", "9", "--", "true")
    assert r.exit_code == 1 and "rejected (never-fits)" in r.output
    r = cli("submit", "--gpus", "-1", "--", "true")
    assert r.exit_code == 2 and "gpus" in r.output and "Traceback" not in r.output
    r = cli("submit", "--bogus", "--", "true")
    assert r.exit_code == 2 and "No such option" in r.output and "Traceback" not in r.output
    r = cli("submit", "--env", "NOEQUALS", "--", "true")
    assert r.exit_code == 2 and "KEY=VALUE" in r.output
    r = cli("status", "j999999")
    assert r.exit_code == 2 and "no job j999999" in r.output
    r = cli("queue", "--token", "wrong-token-1234")
    assert r.exit_code == 1 and "unauthorized" in r.output
    r = cli("status", "j1", "--token", TOKEN_B)
    assert r.exit_code == 1 and "forbidden" in r.output


def test_cli_nodes_top_cancel(server: Server, cli: Any, tmp_path: Path) -> None:
    r = cli("nodes")
    assert r.exit_code == 0, r.output
    assert "h100-0" in r.stdout and "H100-80GB" in r.stdout
    r = cli("submit", "--gpus", "2", "--env", f"PIDFILE={tmp_path / 'pid'}", "--", *SLEEPER)
    assert r.exit_code == 0, r.output
    jid = r.stdout.strip()
    wait_state(server, jid, ("running",))
    r = cli("top", "--once")
    assert r.exit_code == 0, r.output
    for words in ("partitions", "GPU map", "queue head", "shared", jid):
        assert words in r.stdout, (words, r.stdout)
    r = cli("cancel", jid)
    assert r.exit_code == 0 and jid in r.stdout
    assert wait_state(server, jid, ("cancelled",))["state"] == "cancelled"


def test_cli_finds_the_server_from_the_data_dir(server: Server) -> None:
    runner = CliRunner()
    env = {"GPUFENCE_URL": None, "GPUFENCE_TOKEN": ADMIN, "GPUFENCE_DATA": str(server.data)}
    r = runner.invoke(app, ["queue", "--all"], env=env)
    assert r.exit_code == 0, r.output
    # no server there
    r = runner.invoke(app, ["queue"], env={**env, "GPUFENCE_URL": "http://127.0.0.1:9"})
    assert r.exit_code == 1
    assert "no gpufence server at http://127.0.0.1:9" in r.output
    assert "gpufence up --fake-gpus 8" in r.output
