"""Issue 32, accounts and QOS without editing YAML: a real server on 127.0.0.1 (8 fake GPUs),
driven by the admin through the CLI, restarted on the same data directory.

Tenants added at run time submit into their queue; tokens issued, listed (no secret), revoked,
rotated (with and without an overlap) and expired are honoured, or refused with a 401 that says
which, before and after a restart; a queue's weight changed at run time (kept across the
restart) decides which of two waiting gangs the next decision starts; a quota lowered below
what runs stops nothing; a tenant token gets 403 naming the rule.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_helpers import ADMIN, NODES, TOKEN_A, TOKEN_B, Server, call, run_server, submit
from api_helpers import wait_state as wait_job
from cli_server import CliServer, cli_for

from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.http.client import Client
from gpufence.control.reconciler.inbox import TenantRemoved
from gpufence.testing.waiting import until_value

# qc is labelled with a tenant the YAML does not have: nobody's until team-c is added
CONFIG = f"""
name: accounts-test
{NODES}
partitions:
  shared:
    nodes: [h100]
    admits: [serving, training, interactive, batch]
    sharing: exclusive
queues:
  - {{name: qa, partition: shared, tenant: team-a}}
  - {{name: qb, partition: shared, tenant: team-b}}
  - {{name: qc, partition: shared, tenant: team-c}}
control:
  auth:
    admin_token: "{ADMIN}"
    tenants:
      team-a: {{token: "{TOKEN_A}"}}
      team-b: {{token: "{TOKEN_B}"}}
  tenants:
    team-a: {{run_as: root, allow_root: true}}
    team-b: {{run_as: root, allow_root: true}}
  stop_grace_s: 2
"""

SLEEP = ["sleep", "3600"]


class Plane:
    """One server on ``root`` (its data directory survives ``restart``) and a CLI for it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._gen: Iterator[Server] | None = None
        self.srv: Server | None = None
        self.start()

    def start(self) -> None:
        self._gen = run_server(self.root, CONFIG)
        self.srv = next(self._gen)

    def stop(self) -> None:
        assert self._gen is not None
        next(self._gen, None)  # the generator's shutdown (and its checks)
        self._gen = self.srv = None

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def server(self) -> Server:
        assert self.srv is not None
        return self.srv

    def cli(self, *args: str, token: str = ADMIN) -> Any:
        s = self.server
        return cli_for(CliServer(s.url, s.data, Client(url=s.url, token=token)), token)(*args)

    def ok(self, *args: str) -> str:
        out = self.cli(*args)
        assert out.exit_code == 0, (args, out.output)
        return str(out.stdout)

    def status(self, token: str) -> tuple[int, Any]:
        code, body, _ = call(self.server, "GET", "/v1/jobs", token)
        return code, body


def _secret(stdout: str) -> str:
    return stdout.strip().splitlines()[-1]


def _id_of(plane: Plane) -> str:
    """The newest token's id."""
    rows = json.loads(plane.ok("token", "list", "--json"))
    return str(rows[-1]["id"])


def _refused(plane: Plane, token: str, words: str) -> None:
    code, body = plane.status(token)
    assert code == 401, (code, body)
    assert words in body["detail"], body


def test_tenants_and_tokens_across_a_restart(tmp_path: Path) -> None:
    plane = Plane(tmp_path)
    try:
        # a tenant's token cannot manage accounts: 403 naming the rule
        out = plane.cli("token", "issue", "--tenant", "team-a", token=TOKEN_A)
        assert out.exit_code == 1 and "only the admin may issue tokens" in out.output
        assert "rule:" in out.output
        bad = plane.cli("token", "issue", "--tenant", "nobody")
        assert bad.exit_code == 2 and "tenant" in bad.output and "add it first" in bad.output

        # (test servers under pytest's 0700 tmp dirs: its jobs explicitly root, as the YAML's)
        plane.ok("tenant", "add", "team-c", "--run-as", "root", "--allow-root")
        assert "team-c" in plane.ok("tenant", "list")
        keep = _secret(plane.ok("token", "issue", "--tenant", "team-c"))
        keep_id = _id_of(plane)
        short = _secret(plane.ok("token", "issue", "--tenant", "team-c", "--expires", "3s"))
        short_id = _id_of(plane)
        t_revoked = _secret(plane.ok("token", "issue", "--tenant", "team-c"))
        revoked_id = _id_of(plane)
        t_overlap = _secret(plane.ok("token", "issue", "--tenant", "team-c"))
        overlap_id = _id_of(plane)
        for t in (keep, short, t_revoked, t_overlap):
            assert plane.status(t)[0] == 200

        listing = plane.ok("token", "list")
        assert keep_id in listing and all(t not in listing for t in (keep, short, t_revoked))
        assert keep not in (tmp_path / "data" / "gpufence.db").read_bytes().decode("latin-1")

        plane.ok("token", "revoke", revoked_id)
        _refused(plane, t_revoked, f"token {revoked_id} was revoked")
        rotated = _secret(plane.ok("token", "rotate", keep_id))
        _refused(plane, keep, "was rotated")
        assert plane.status(rotated)[0] == 200
        after_overlap = _secret(plane.ok("token", "rotate", overlap_id, "--overlap", "4s"))
        assert plane.status(t_overlap)[0] == 200  # still in its overlap
        assert plane.status(after_overlap)[0] == 200

        # a tenant added at run time submits: its jobs go to the queue labelled with its name
        code, job = submit(plane.server, {"command": SLEEP, "gpus": 1}, token=rotated)
        assert code == 201, job
        assert wait_job(plane.server, job["id"], ("running",))["queue"] == "qc"

        plane.restart()
        assert plane.status(rotated)[0] == 200
        assert plane.status(after_overlap)[0] == 200
        _refused(plane, keep, "was rotated")
        _refused(plane, t_revoked, "was revoked")
        until_value(lambda: plane.status(short)[0], lambda c: c == 401, 10, "short expired")
        _refused(plane, short, f"token {short_id} expired at")
        until_value(lambda: plane.status(t_overlap)[0], lambda c: c == 401, 10, "overlap over")
        _refused(plane, t_overlap, "overlap ended")
        assert "team-c" in plane.ok("tenant", "list")

        # removing a tenant with a live job: 409 saying what to do; once it ended: done
        out = plane.cli("tenant", "remove", "team-c")
        assert out.exit_code == 1 and "pending or running" in out.output, out.output
        assert call(plane.server, "POST", f"/v1/jobs/{job['id']}/cancel")[0] == 200
        wait_job(plane.server, job["id"], ("cancelled",))
        plane.ok("tenant", "remove", "team-c")
        _refused(plane, rotated, "removed")
        # a submit authenticated just before the removal is refused where it is written
        late = plane.server.plane.submit_future(SubmitRequest(command=SLEEP, gpus=1), "team-c")
        with pytest.raises(TenantRemoved, match="team-c was removed"):
            late.result(30)

        audit = json.loads(plane.ok("audit", "--json"))
        actions = [(a["actor"], a["action"], a["target"]) for a in audit]
        for want in [
            ("admin", "tenant.add", "team-c"),
            ("admin", "token.revoke", revoked_id),
            ("admin", "token.rotate", keep_id),
            ("admin", "tenant.remove", "team-c"),
        ]:
            assert want in actions, actions
        revoke = next(a for a in audit if a["action"] == "token.revoke")
        assert '"status":"active"' in revoke["old"] and '"status":"revoked"' in revoke["new"]
        plane.restart()
        _refused(plane, rotated, "removed")
        assert "team-c" not in plane.ok("tenant", "list")
    finally:
        plane.stop()


def _running_pending(plane: Plane, a: str, b: str) -> tuple[str, str]:
    def states() -> tuple[str, str]:
        return (
            call(plane.server, "GET", f"/v1/jobs/{a}")[1]["state"],
            call(plane.server, "GET", f"/v1/jobs/{b}")[1]["state"],
        )

    return until_value(states, lambda s: "running" in s, 20, "one gang running")


def test_queue_weight_set_at_run_time_orders_the_next_decisions(tmp_path: Path) -> None:
    """qa runs 6 GPUs and qb 2 while a gang of each waits for all 8: at equal weights qb is
    owed more and its gang starts first; with qa's weight raised to 10 (before a restart,
    which keeps it) qa's does. Then qa's quota lowered to 0 stops nothing but new work."""
    plane = Plane(tmp_path)
    try:
        out = plane.cli("queue", "set", "qa", "--weight", "10", token=TOKEN_A)
        assert out.exit_code == 1 and "only the admin may change queue settings" in out.output
        bad = plane.cli("queue", "set", "nope", "--weight", "2")
        assert bad.exit_code == 2 and "no queue nope" in bad.output, bad.output
        assert "weight 10" in plane.ok("queue", "set", "qa", "--weight", "10")
        plane.restart()
        shown = {q["queue"]: q for q in json.loads(plane.ok("queue", "show", "--json"))}
        assert shown["qa"]["weight"] == 10 and shown["qa"]["weight_source"] == "runtime"
        assert shown["qb"]["weight"] == 1 and shown["qb"]["weight_source"] == "yaml"

        srv = plane.server
        blockers = []
        for queue, gpus in (("qa", 6), ("qb", 2)):
            code, job = submit(srv, {"command": SLEEP, "gpus": gpus, "queue": queue})
            assert code == 201, job
            blockers.append(job["id"])
        for jid in blockers:
            wait_job(srv, jid, ("running",))
        time.sleep(1.0)  # usage to weigh
        gang_a = submit(srv, {"command": SLEEP, "gpus": 8}, token=TOKEN_A)[1]["id"]
        gang_b = submit(srv, {"command": SLEEP, "gpus": 8}, token=TOKEN_B)[1]["id"]
        for jid in blockers:
            assert call(srv, "POST", f"/v1/jobs/{jid}/cancel")[0] == 200
        assert _running_pending(plane, gang_a, gang_b) == ("running", "pending")

        # a quota below what qa runs: nothing is stopped, new work of qa waits for quota
        assert "quota 0 GPUs" in plane.ok("queue", "set", "qa", "--quota", "0")
        code, small = submit(srv, {"command": SLEEP, "gpus": 1}, token=TOKEN_A)
        assert code == 201, small
        time.sleep(1.5)
        assert call(srv, "GET", f"/v1/jobs/{gang_a}")[1]["state"] == "running"
        # all 8 GPUs free: qa's new job still waits, for its quota (the core has it now)
        for jid in (gang_a, gang_b):
            assert call(srv, "POST", f"/v1/jobs/{jid}/cancel")[0] == 200
            wait_job(srv, jid, ("cancelled",))
        time.sleep(1.5)
        job = call(srv, "GET", f"/v1/jobs/{small['id']}")[1]
        assert job["state"] == "pending" and job["pending"]["reason"] == "quota", job
        assert "nominal quota (0 GPUs)" in job["pending"]["message"]
        assert "quota none" in plane.ok("queue", "set", "qa", "--quota", "none")
        wait_job(srv, small["id"], ("running",))
        audit = json.loads(plane.ok("audit", "--json"))
        sets = [a for a in audit if a["action"] == "queue.set"]
        assert '"quota_gpus":null' in sets[0]["new"] and '"quota_gpus":0.0' in sets[1]["new"]
        assert '"weight":1.0' in sets[2]["old"] and '"weight":10.0' in sets[2]["new"]
    finally:
        plane.stop()
