"""Drains and maintenance windows through the real CLI and a real server (8 fake GPUs on one
node, h100-0): the admin drains and undrains, a tenant is refused (403); a job waits on a
drained node with the drain named, and a drain deadline notices a running job and requeues it;
a maintenance window keeps a job without a time limit off its node (named in the reason) while
a job that ends before it runs; drains and windows survive a restart, and each change is in
the event log."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from api_helpers import ADMIN, CONFIG, SLEEPER, TOKEN_A, Server, call, run_server, wait_state
from typer.testing import CliRunner

from gpufence.cli.main import app
from gpufence.control.http.maintenance_routes import MaintenanceList
from gpufence.testing.waiting import until_value

pytestmark = pytest.mark.slow  # two servers one after the other


def cli(srv: Server, *args: str, token: str = ADMIN) -> Any:
    env = {"GPUFENCE_URL": srv.url, "GPUFENCE_TOKEN": token, "GPUFENCE_DATA": None}
    return CliRunner().invoke(app, list(args), env=env)


def submit(srv: Server, command: list[str], **fields: Any) -> str:
    status, body, _ = call(srv, "POST", "/v1/jobs", body={"command": command, **fields})
    assert status in (200, 201), body
    return str(body["id"])


def why(srv: Server, jid: str, containing: str) -> str:
    def read() -> str:
        status, job, _ = call(srv, "GET", f"/v1/jobs/{jid}")
        assert status == 200, job
        why = job.get("pending") or {}
        return f"{job['state']}: {why.get('reason')}: {why.get('message')}"

    return until_value(read, lambda w: containing in w, 20, f"{jid}'s reason has {containing!r}")


def serve(root: Path) -> Iterator[Server]:
    spec = yaml.safe_load(CONFIG)
    spec["control"]["stop_grace_s"] = 1
    return run_server(root, yaml.safe_dump(spec))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path


def test_drain_undrain_and_tenant_refused(root: Path) -> None:
    for srv in serve(root):
        got = cli(srv, "node", "drain", "h100-0", "--reason", "swap a PSU", token=TOKEN_A)
        assert got.exit_code == 1 and "forbidden" in got.output.lower(), got.output
        got = cli(srv, "node", "drain", "h100-0", "--reason", "swap a PSU")
        assert got.exit_code == 0, got.output
        assert "node h100-0 drained: swap a PSU" in got.output
        got = cli(srv, "node", "list", "-o", "json")
        assert got.exit_code == 0, got.output
        nodes = json.loads(got.output)["nodes"]
        assert nodes == [
            {"name": "h100-0", "up": True, "drain": {"reason": "swap a PSU", "deadline": None}}
        ]
        jid = submit(srv, ["true"])
        assert "pending" in why(srv, jid, "node h100-0 drained: swap a PSU")
        got = cli(srv, "node", "drain", "nope-9", "--reason", "x")
        assert got.exit_code == 2 and "no node 'nope-9'" in got.output, got.output
        assert cli(srv, "node", "undrain", "h100-0", token=TOKEN_A).exit_code == 1
        assert cli(srv, "node", "undrain", "h100-0").exit_code == 0
        wait_state(srv, jid, ("done",))
        got = cli(srv, "node", "undrain", "h100-0")  # 404, as an unknown job: 2
        assert got.exit_code == 2 and "node h100-0 is not drained" in got.output, got.output


def test_drain_deadline_notices_and_requeues_running_work(root: Path, tmp_path: Path) -> None:
    for srv in serve(root):
        pidfile = tmp_path / "pid"
        jid = submit(srv, SLEEPER, env={"PIDFILE": str(pidfile)}, checkpointable=True)
        wait_state(srv, jid, ("running",))
        got = cli(srv, "node", "drain", "h100-0", "--reason", "reboot", "--deadline", "1s")
        assert got.exit_code == 0, got.output
        assert "running work stopped by" in got.output
        # noticed, stopped at the deadline, requeued: it waits on the drained node again
        assert "pending" in why(srv, jid, "node h100-0 drained: reboot")
        status, body, _ = call(srv, "GET", f"/v1/events?job={jid}")
        assert status == 200
        kinds = [(e["kind"], e["reason"]) for e in body["events"]]
        assert ("notice", "drain") in kinds and ("stop", "drain") in kinds, kinds


def test_maintenance_window_and_restart(root: Path) -> None:
    for srv in serve(root):
        long = submit(srv, ["sleep", "60"])
        wait_state(srv, long, ("running",))
        args = ["reserve", "--nodes", "h100-0", "--start", "+1h", "--duration", "2h"]
        got = cli(srv, *args, "--reason", "firmware", token=TOKEN_A)
        assert got.exit_code == 1 and "forbidden" in got.output.lower(), got.output
        got = cli(srv, *args, "--reason", "firmware")
        assert got.exit_code == 0, got.output
        assert got.output.startswith("maintenance m1 on h100-0 from ")
        assert "for 2h: firmware" in got.output
        assert f"warning: {long} (no time limit) runs on its nodes" in got.output
        status, _, _ = call(srv, "POST", f"/v1/jobs/{long}/cancel")
        wait_state(srv, long, ("cancelled",))
        unbounded = submit(srv, ["true"])
        reason = why(srv, unbounded, "for 7200 s: firmware")
        assert re.search(
            r"maintenance m1 on h100-0 from \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", reason
        )
        short = submit(srv, ["true"], time_limit_s=60)
        wait_state(srv, short, ("done",))  # ends long before the window
        got = cli(srv, "reserve", "list", "-o", "json")
        assert got.exit_code == 0, got.output
        doc = json.loads(got.output)
        assert MaintenanceList.model_validate(doc).model_dump() == doc  # the documented model
        [window] = doc["maintenance"]
        assert (window["id"], window["nodes"], window["state"]) == ("m1", ["h100-0"], "scheduled")
        assert window["duration_s"] == 7200
        assert cli(srv, "node", "drain", "h100-0", "--reason", "disk").exit_code == 0
    for srv in serve(root):  # the same data directory: a restart
        assert "node h100-0 drained: disk" in why(srv, unbounded, "drained")
        assert "maintenance m1" in why(srv, unbounded, "maintenance m1")
        got = cli(srv, "reserve", "list", "-o", "json")
        assert [w["id"] for w in json.loads(got.output)["maintenance"]] == ["m1"]
        assert cli(srv, "node", "undrain", "h100-0").exit_code == 0
        assert "maintenance m1" in why(srv, unbounded, "maintenance m1")  # still the window
        assert cli(srv, "reserve", "delete", "m1", token=TOKEN_A).exit_code == 1
        assert cli(srv, "reserve", "delete", "m1").exit_code == 0
        wait_state(srv, unbounded, ("done",))
        got = cli(srv, "reserve", "delete", "m1")  # 404: gone
        assert got.exit_code == 2 and "no maintenance window m1" in got.output, got.output
        # audited: every change in the event log, with who made it
        status, body, _ = call(srv, "GET", "/v1/events?limit=10000")
        assert status == 200
        audit = [(e["kind"], e["message"]) for e in body["events"] if e["job_id"] is None]
        kinds = [k for k, _ in audit]
        assert kinds == [
            "maintenance-add",
            "node-drain",
            "node-undrain",
            "maintenance-delete",
        ], audit
        assert all(m.endswith("by admin") or "by admin" in m for _, m in audit), audit


def test_a_window_closes_and_reopens_its_node_on_time(root: Path) -> None:
    """Nothing but the clock happens: the plane wakes at the window's start and end (the core's
    next_wakeup) and the node closes, then takes the waiting job."""
    for srv in serve(root):
        args = ["reserve", "--nodes", "h100-0", "--start", "+2s", "--duration", "3s"]
        got = cli(srv, *args, "--reason", "cable")
        assert got.exit_code == 0, got.output
        waiting = submit(srv, ["true"])  # no time limit: it would run into the window
        assert "pending" in why(srv, waiting, "maintenance m1 on h100-0")
        got = cli(srv, "reserve", "list", "-o", "json")
        assert json.loads(got.output)["maintenance"][0]["state"] == "scheduled"
        until_value(
            lambda s=srv: json.loads(cli(s, "reserve", "list", "-o", "json").output),
            lambda d: d["maintenance"][0]["state"] == "active",
            10,
            "the window begun",
        )
        nodes = json.loads(cli(srv, "node", "list", "-o", "json").output)["nodes"]
        assert nodes[0]["drain"] == {"reason": "maintenance m1: cable", "deadline": None}
        assert "pending" in why(srv, waiting, "maintenance m1 on h100-0")
        doc = json.loads(cli(srv, "reserve", "list", "-o", "json").output)
        end = doc["maintenance"][0]["end"]
        time.sleep(max(0.0, end - doc["now"]) + 4.0)  # no request meanwhile: only the clock
        job = wait_state(srv, waiting, ("done",), timeout=20)
        # it started at the end of the window, woken by the core's next_wakeup, not at the next
        # request (end + 4 s or later; 3 s is for a loaded machine's late cycle)
        assert end <= job["started_at"] < end + 3.0, (job, end)
