"""Issue 32: change a pending or running job as ``scontrol update`` does (``PATCH /v1/jobs/{ref}``,
``gpufence update``), hold and release, over real HTTP on 127.0.0.1 with real processes.

Each rule has its test: a tenant only lowers a time limit (403 raising it, the admin may), the
running job is stopped at the new limit; a tenant lowers a priority or raises it up to 0; a
partition or queue changes only while pending (409 naming the state and the fix), to a
partition that exists and can hold the job, into a queue of the tenant's own (403 otherwise);
the job with the change is validated as a submit; each change is an audit event; hold names who
held it and a job the admin held is released by the admin only; and a restart keeps every
change (a running job's lowered limit still stops it, counted from its start).

The cluster: partition ``main`` (GPUs 0-1; queues ``qa`` of team-a and ``qb`` of team-b) and
partition ``spare`` (GPU 2; queue ``sa`` of team-a); serving has the rest.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_helpers import ADMIN, TOKEN_A, TOKEN_B, Server, call, wait_state
from typer.testing import CliRunner

from gpufence.cli.main import app
from gpufence.control.base.config import SERVER_FILE
from gpufence.control.http.server import build_plane, serve
from gpufence.testing.waiting import until_value

CONFIG = f"""
name: update-test
node_groups:
  - {{name: local, count: 1, gpus_per_node: 8, gpu_type: H100-80GB, nvlink_domains: [8]}}
partitions:
  main: {{gpus: ["local:0-1"], admits: [training, batch], sharing: exclusive}}
  spare: {{gpus: ["local:2"], admits: [training, batch], sharing: exclusive}}
  rest: {{gpus: ["local:3-7"], admits: [serving], sharing: exclusive}}
queues:
  - {{name: qa, partition: main, tenant: team-a}}
  - {{name: qb, partition: main, tenant: team-b}}
  - {{name: sa, partition: spare, tenant: team-a}}
control:
  auth:
    admin_token: "{ADMIN}"
    tenants:
      team-a: {{token: "{TOKEN_A}"}}
      team-b: {{token: "{TOKEN_B}"}}
  tenants:
    team-a: {{run_as: root, allow_root: true}}
    team-b: {{run_as: root, allow_root: true}}
  stop_grace_s: 1
"""

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


def start(root: Path) -> Iterator[Server]:
    """A real server on 127.0.0.1 (port 0) over ``root/data``; running jobs outlive it (a
    restart adopts them), so the test that restarts it sees what a crash-free restart keeps."""
    cfg = root / "cluster.yaml"
    cfg.write_text(CONFIG, encoding="utf-8")
    data = root / "data"
    plane = build_plane(cfg, data, 8, "H100-80GB")
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=serve,
        args=(plane, "127.0.0.1", 0, ready, stop),
        kwargs={"kill_jobs": False, "log_level": "warning"},
        daemon=True,
    )
    thread.start()
    assert ready.wait(30), "server did not start"
    info = json.loads((data / SERVER_FILE).read_text())
    try:
        yield Server(info["url"], data, plane)
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive()


def sub(srv: Server, token: str, **fields: Any) -> str:
    status, out, _ = call(srv, "POST", "/v1/jobs", token, {"command": SLEEP, **fields})
    assert status == 201, out
    return str(out["id"])


def patch(srv: Server, ref: str, token: str, **changes: Any) -> tuple[int, Any]:
    status, out, _ = call(srv, "PATCH", f"/v1/jobs/{ref}", token, changes)
    return status, out


def spec(srv: Server, jid: str) -> dict[str, Any]:
    status, job, _ = call(srv, "GET", f"/v1/jobs/{jid}")
    assert status == 200, job
    return dict(job["spec"])


def updates(srv: Server, jid: str, kind: str = "update") -> list[str]:
    status, out, _ = call(srv, "GET", f"/v1/events?job={jid}")
    assert status == 200, out
    return [e["message"] for e in out["events"] if e["kind"] == kind]


def pending_why(srv: Server, jid: str, token: str = ADMIN) -> str:
    def read() -> str:
        status, out, _ = call(srv, "GET", f"/v1/jobs/{jid}/explain", token)
        assert status == 200, out
        return str((out.get("pending") or {}).get("message") or "")

    return until_value(read, lambda m: m not in ("", "queued"), 15, f"why {jid} waits")


def cancel_all(srv: Server) -> None:
    status, out, _ = call(srv, "GET", "/v1/jobs?state=pending&state=starting&state=running")
    assert status == 200, out
    for j in out["jobs"]:
        call(srv, "POST", f"/v1/jobs/{j['id']}/cancel")
    for j in out["jobs"]:
        wait_state(srv, j["id"], ("cancelled", "done", "failed"), 30)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    gen = start(tmp_path_factory.mktemp("upd"))
    srv = next(gen)
    try:
        yield srv
    finally:
        cancel_all(srv)
        gen.close()


@pytest.fixture
def clean(server: Server) -> Iterator[Server]:
    yield server
    cancel_all(server)


def test_a_tenant_lowers_a_running_jobs_time_limit_and_it_stops_there(clean: Server) -> None:
    srv = clean
    jid = sub(srv, TOKEN_A, queue="qa", time_limit_s=600)
    wait_state(srv, jid, ("running",))
    status, out = patch(srv, jid, TOKEN_A, time_limit_s=3)
    assert status == 200, out
    assert out["jobs"] == [{"id": jid, "state": "running"}]
    job = wait_state(srv, jid, ("failed",), 30)
    assert job["reason"] == "time-limit"
    assert spec(srv, jid)["time_limit_s"] == 3
    assert updates(srv, jid) == ["by team-a: time_limit_s 600 -> 3"]


def test_raising_a_time_limit_needs_the_admin(clean: Server) -> None:
    srv = clean
    jid = sub(srv, TOKEN_A, queue="qa", time_limit_s=600)
    wait_state(srv, jid, ("running",))
    status, out = patch(srv, jid, TOKEN_A, time_limit_s=1200)
    assert status == 403, out
    assert "a tenant may only lower a job's time limit" in out["detail"]
    assert "admin token" in out["detail"]
    assert spec(srv, jid)["time_limit_s"] == 600 and updates(srv, jid) == []
    status, out = patch(srv, jid, ADMIN, time_limit_s=1200)
    assert status == 200, out
    assert spec(srv, jid)["time_limit_s"] == 1200
    assert updates(srv, jid) == ["by admin: time_limit_s 600 -> 1200"]


def test_priority_a_tenant_lowers_or_raises_up_to_the_default(clean: Server) -> None:
    srv = clean
    jid = sub(srv, TOKEN_A, queue="qa")
    status, out = patch(srv, jid, TOKEN_A, priority=5)
    assert status == 403, out
    assert "raise it up to the default 0 (now 0, asked 5)" in out["detail"]
    assert patch(srv, jid, TOKEN_A, priority=-5)[0] == 200
    assert patch(srv, jid, TOKEN_A, priority=0)[0] == 200  # back up to the default
    assert patch(srv, jid, ADMIN, priority=7)[0] == 200
    assert patch(srv, jid, TOKEN_A, priority=7)[0] == 200  # a retry: no change, no event
    assert spec(srv, jid)["priority"] == 7
    assert updates(srv, jid) == [
        "by team-a: priority 0 -> -5",
        "by team-a: priority -5 -> 0",
        "by admin: priority 0 -> 7",
    ]


def test_a_raised_priority_runs_first(clean: Server) -> None:
    srv = clean
    blocker = sub(srv, ADMIN, queue="qa", gpus=2)
    wait_state(srv, blocker, ("running",))
    first = sub(srv, TOKEN_A, queue="qa", gpus=2)
    second = sub(srv, TOKEN_A, queue="qa", gpus=2)
    assert patch(srv, second, ADMIN, priority=10)[0] == 200
    call(srv, "POST", f"/v1/jobs/{blocker}/cancel")
    wait_state(srv, second, ("running",), 30)
    assert call(srv, "GET", f"/v1/jobs/{first}")[1]["state"] == "pending"


def test_a_running_job_keeps_its_partition_and_queue(clean: Server) -> None:
    srv = clean
    jid = sub(srv, TOKEN_A, queue="qa")
    wait_state(srv, jid, ("running",))
    for field, value in (("partition", "spare"), ("queue", "sa")):
        status, out = patch(srv, jid, TOKEN_A, **{field: value})
        assert status == 409, out
        assert f"job {jid} is running" in out["detail"]
        assert "cancel it and submit it again" in out["detail"]


def test_a_pending_job_moves_to_another_partition_and_queue(clean: Server) -> None:
    srv = clean
    blocker = sub(srv, ADMIN, queue="qa", gpus=2)
    wait_state(srv, blocker, ("running",))
    jid = sub(srv, TOKEN_A, queue="qa")
    status, out = patch(srv, jid, TOKEN_A, partition="spare", queue="sa")
    assert status == 200, out
    job = wait_state(srv, jid, ("running",), 30)
    assert (job["partition"], job["queue"]) == ("spare", "sa")
    assert updates(srv, jid) == ["by team-a: partition (default) -> spare, queue qa -> sa"]


@pytest.mark.parametrize(
    ("changes", "token", "status", "field", "words"),
    [
        ({"partition": "nowhere"}, TOKEN_A, 422, "body.partition", "does not exist"),
        ({"partition": "spare", "queue": "sa"}, TOKEN_A, 422, "body.partition", "at most 1"),
        ({"queue": "qb"}, TOKEN_A, 403, None, "queue 'qb' belongs to tenant 'team-b'"),
        ({"queue": "sa"}, TOKEN_A, 422, "body.queue", "spare have at most 1"),
        ({"time_limit_s": 50}, TOKEN_A, 422, "body.time_limit_s", "est_runtime_s (100)"),
        ({}, TOKEN_A, 422, "body", "give at least one of"),
        ({"priority": 2000}, ADMIN, 422, "body.priority", "1000"),
    ],
    ids=["no-such-partition", "too-big-for-it", "other-tenants-queue", "queue-elsewhere",
         "limit-under-estimate", "nothing", "priority-range"],
)  # fmt: skip
def test_a_change_is_validated_as_a_submit(
    clean: Server,
    changes: dict[str, Any],
    token: str,
    status: int,
    field: str | None,
    words: str,
) -> None:
    srv = clean
    blocker = sub(srv, ADMIN, queue="qa", gpus=2)
    wait_state(srv, blocker, ("running",))
    jid = sub(srv, TOKEN_A, queue="qa", gpus=2, est_runtime_s=100, time_limit_s=600)
    before = spec(srv, jid)
    got, out = patch(srv, jid, token, **changes)
    assert got == status, out
    assert words in out["detail"]
    if field is not None:
        assert out["errors"][0]["field"] == field, out
    assert spec(srv, jid) == before and updates(srv, jid) == []


def test_hold_names_who_and_release_puts_it_back(clean: Server) -> None:
    srv = clean
    blocker = sub(srv, ADMIN, queue="qa", gpus=2)
    wait_state(srv, blocker, ("running",))
    mine = sub(srv, TOKEN_A, queue="qa", gpus=2)
    theirs = sub(srv, TOKEN_A, queue="qa", gpus=2)
    assert call(srv, "POST", f"/v1/jobs/{mine}/hold", TOKEN_A)[0] == 200
    assert pending_why(srv, mine, TOKEN_A) == "held by team-a; release it to let it run"
    assert updates(srv, mine, "hold") == ["held by team-a"]
    # the admin's hold is the admin's to release
    assert call(srv, "POST", f"/v1/jobs/{theirs}/hold", ADMIN)[0] == 200
    status, out, _ = call(srv, "POST", f"/v1/jobs/{theirs}/release", TOKEN_A)
    assert status == 403 and "only the admin releases it" in out["detail"], out
    assert call(srv, "POST", f"/v1/jobs/{theirs}/release", ADMIN)[0] == 200
    assert call(srv, "POST", f"/v1/jobs/{mine}/release", TOKEN_A)[0] == 200
    call(srv, "POST", f"/v1/jobs/{blocker}/cancel")
    # released, it is back in its place: ahead of the one submitted after it
    wait_state(srv, mine, ("running",), 30)
    assert call(srv, "GET", f"/v1/jobs/{theirs}")[1]["state"] == "pending"
    assert updates(srv, theirs, "release") == ["released by admin"]


def test_holding_a_running_job_is_refused_with_the_fix(clean: Server) -> None:
    srv = clean
    jid = sub(srv, TOKEN_A, queue="qa")
    wait_state(srv, jid, ("running",))
    status, out, _ = call(srv, "POST", f"/v1/jobs/{jid}/hold", TOKEN_A)
    assert status == 409, out
    assert f"job {jid} is running: only pending jobs can be held" in out["detail"]
    assert f"gpufence update {jid} --time-limit" in out["detail"]


def test_another_tenants_job_is_not_theirs_to_change(clean: Server) -> None:
    srv = clean
    jid = sub(srv, TOKEN_A, queue="qa")
    status, out = patch(srv, jid, TOKEN_B, priority=-1)
    assert status == 404, out
    assert spec(srv, jid).get("priority", 0) == 0


def test_the_cli_updates_an_array_and_prints_each_task(clean: Server) -> None:
    srv = clean
    blocker = sub(srv, ADMIN, queue="qa", gpus=2)
    wait_state(srv, blocker, ("running",))
    status, out, _ = call(
        srv, "POST", "/v1/jobs", TOKEN_A, {"command": SLEEP, "queue": "qa", "array": "0-2"}
    )
    assert status == 201, out
    env = {"GPUFENCE_URL": srv.url, "GPUFENCE_TOKEN": TOKEN_A}
    res = CliRunner().invoke(app, ["update", out["id"], "--time-limit", "30m"], env=env)
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [
        f"{t}: pending, updated: time limit 30m" for t in out["tasks"]
    ]
    assert all(spec(srv, t)["time_limit_s"] == 1800 for t in out["tasks"])
    res = CliRunner().invoke(app, ["events", "--job", out["tasks"][1], "-o", "json"], env=env)
    assert res.exit_code == 0, res.output
    said = [e["message"] for e in json.loads(res.output)["events"] if e["kind"] == "update"]
    assert said == ["by team-a: time_limit_s none -> 1800"]
    res = CliRunner().invoke(app, ["update", out["tasks"][0], "--priority", "3"], env=env)
    assert res.exit_code == 1 and "higher needs the admin token" in res.output, res.output


def test_a_restart_keeps_every_change(tmp_path: Path) -> None:
    gen = start(tmp_path)
    srv = next(gen)
    blocker = sub(srv, ADMIN, queue="qa", gpus=2, time_limit_s=600)
    wait_state(srv, blocker, ("running",))
    started = time.monotonic()
    moved = sub(srv, TOKEN_A, queue="qa", gpus=2)
    held = sub(srv, TOKEN_A, queue="qa")
    assert patch(srv, blocker, ADMIN, time_limit_s=12)[0] == 200
    assert patch(srv, moved, TOKEN_A, priority=-3, time_limit_s=99)[0] == 200
    assert call(srv, "POST", f"/v1/jobs/{held}/hold", TOKEN_A)[0] == 200
    gen.close()  # stopped; the blocker's processes keep running
    gen = start(tmp_path)
    srv = next(gen)
    try:
        assert spec(srv, moved)["priority"] == -3 and spec(srv, moved)["time_limit_s"] == 99
        assert updates(srv, moved) == ["by team-a: priority 0 -> -3, time_limit_s none -> 99"]
        assert pending_why(srv, held, TOKEN_A) == "held by team-a; release it to let it run"
        # the adopted blocker is still held to its lowered limit, counted from its start
        job = wait_state(srv, blocker, ("failed",), 40)
        assert job["reason"] == "time-limit"
        assert time.monotonic() - started < 35
        wait_state(srv, moved, ("running",), 30)
    finally:
        cancel_all(srv)
        gen.close()
