"""The HTTP API and the CLI verbs against a real server on 127.0.0.1 (8 fake GPUs, real processes).

One server for the module: ``serve`` in a thread on port 0 with a tmp data dir and a config whose
``control.auth`` has an admin token and two tenants. Jobs are short ``python -c`` commands.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_helpers import (
    ADMIN,
    CONFIG,
    PRINT_DEVICES,
    SLEEPER,
    TOKEN_A,
    TOKEN_B,
    Server,
    call,
    gone,
    run_server,
    submit,
    wait_state,
)
from prometheus_client import CONTENT_TYPE_LATEST
from typer.testing import CliRunner

from gpufence.cli.main import app
from gpufence.testing.waiting import until

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
        assert out["type"] == "urn:gpufence:problem:invalid" and out["status"] == 422, out
        assert any(e["field"].startswith(f"body.{field}") for e in out["errors"]), out
        assert out["field"] == out["errors"][0]["field"] and out["detail"]
    status, out, headers = call(server, "GET", "/v1/jobs?state=nonsense")
    assert status == 422 and out["field"].startswith("query.state"), out
    assert headers["content-type"] == "application/problem+json"
    status, out, _ = call(server, "GET", "/v1/jobs/j1/logs?stream=both")
    assert status == 422


def test_a_submit_the_reconciler_does_not_answer_in_time_is_503_and_safe_to_retry(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The submit route's own front maps the timeout to the app's 503 (``busy``,
    ``Retry-After``); the request still lands, the retry with its key gets that job, and the
    job runs (the cancelled future of the caller that gave up costs the reconciler nothing)."""
    import threading

    from gpufence.control.http import submission

    monkeypatch.setattr(submission, "CALL_TIMEOUT_S", 0.3)
    release, busy = threading.Event(), threading.Event()

    def hold_the_reconciler(_r: object) -> None:
        busy.set()
        release.wait(10)

    server.plane.reconciler.call(hold_the_reconciler)
    # submitted only once the reconciler is inside the call: taken in one batch with it, the
    # submit could be answered before the call began (seen under CI load: 201, not 503)
    assert busy.wait(10)
    body = {"command": ["true"], "gpus": 1}
    key = {"Idempotency-Key": "busy-then-retried"}
    try:
        status, out, headers = call(server, "POST", "/v1/jobs", ADMIN, body, headers=key)
    finally:
        release.set()
    assert status == 503 and out["type"] == "urn:gpufence:problem:busy", out
    assert headers["Retry-After"] == "1"
    monkeypatch.setattr(submission, "CALL_TIMEOUT_S", 30.0)
    status, out, _ = call(server, "POST", "/v1/jobs", ADMIN, body, headers=key)
    assert status == 200 and out["id"].startswith("j"), out  # the job the first one created
    # the answer the timed-out caller no longer waited for did not abort the reconciler's
    # cycle between committing the bind and spawning it: the job runs to its end
    wait_state(server, out["id"], ("done",))


def test_jobs_no_partition_can_hold_are_rejected_at_submit(server: Server) -> None:
    for body, field, words in (
        ({"command": ["true"], "gpus": 9}, "gpus", "9 GPUs"),
        ({"command": ["true"], "mig": "1g.10gb"}, "mig", "MIG"),
        ({"command": ["true"], "partition": "nope"}, "partition", "does not exist"),
    ):
        status, out = submit(server, body)
        assert status == 422, out
        assert out["type"] == "urn:gpufence:problem:rejected" and out["field"] == f"body.{field}"
        assert words in out["detail"] and out["reason"] in ("never-fits", "invalid"), out
        job = out["job"]
        assert job["state"] == "rejected"
        # the row stays, so `status` can show it
        stored = call(server, "GET", f"/v1/jobs/{job['id']}")[1]
        assert stored["state"] == "rejected" and stored["message"] == out["detail"]


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
    assert 'gpufence_queue_pending_jobs{class="batch",partition="shared",queue="shared"}' in text
    assert 'gpufence_partition_capacity_gpus{partition="shared"} 8.0' in text


def test_metrics_can_be_closed_to_all_but_the_admin(tmp_path: Path) -> None:
    """``/metrics`` names tenants and jobs: with ``telemetry.metrics_auth: admin`` a tenant's
    token or none gets 401, the admin token (what a Prometheus scrape config sends) the text."""
    config = CONFIG.replace(
        "  stop_grace_s: 2", "  stop_grace_s: 2\n  telemetry: {metrics_auth: admin}"
    )
    for srv in run_server(tmp_path, config):
        for token in (None, TOKEN_A):
            status, out, _ = call(srv, "GET", "/metrics", token=token)
            assert status == 401 and "admin token" in out["detail"], out
        status, text, _ = call(srv, "GET", "/metrics", token=ADMIN)
        assert status == 200 and "gpufence_queue_delay_seconds" in text


def test_nodes_and_partitions_shapes(server: Server) -> None:
    status, body, _ = call(server, "GET", "/v1/nodes", token=TOKEN_A)
    assert status == 200
    (node,) = body["nodes"]
    assert node["fake"] is True and node["up"] is True
    assert [g["index"] for g in node["gpus"]] == list(range(8))
    for g in node["gpus"]:
        assert g["partition"] == "shared" and g["type"] == "H100-80GB"
        assert g["state"] in ("free", "used", "held") and isinstance(g["jobs"], list)
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


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/jobs/j999999/cancel"])
@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_that_says_it_is_not_json_is_refused_415(
    server: Server, path: str, kind: str
) -> None:
    """Issue 30, case 10: a body is JSON and says so; ``text/plain`` is not parsed as JSON."""
    body = b'{"command": ["true"]}'
    status, out, _ = call(server, "POST", path, raw=body, headers={"Content-Type": kind})
    assert status == 415, out
    assert kind in out["detail"]
    status, _, _ = call(server, "POST", "/v1/jobs", raw=body)  # application/json: accepted
    assert status == 201
