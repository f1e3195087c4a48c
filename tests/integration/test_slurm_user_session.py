"""A Slurm user's session, end to end, as a newcomer runs it (issue 32, "Done when"): every step
through the real ``gpufence`` CLI as a subprocess against a real server on 127.0.0.1 (8 fake GPUs
on one node, h100-0):

1. the admin issues the user a token; the user works with it;
2. an ``#SBATCH`` array script with a dependency on a prep job runs after it, each task's
   output in its own ``%A_%a.out``;
3. an interactive ``run --pty`` shell holds its GPU until it exits, then frees it;
4. a drained node takes no new work, and the pending reason names the drain; undrained, it does;
5. a maintenance reservation ahead: backfill starts a job whose time limit ends before it, a job
   without a limit waits with the window named;
6. the admin rotates the user's token: the old one is refused (401), the new one works.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from api_helpers import ADMIN, CONFIG, Server, call, run_server

from gpufence.testing.waiting import until, until_value

pytestmark = pytest.mark.slow  # one server, a dozen CLI processes


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[Server]:
    spec = yaml.safe_load(CONFIG)
    spec["control"]["stop_grace_s"] = 1
    server = run_server(tmp_path, yaml.safe_dump(spec))
    yield next(server)
    next(server, None)


def gf(srv: Server, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``gpufence ARGS`` as a user types it, with ``token``."""
    env = {**os.environ, "GPUFENCE_URL": srv.url, "GPUFENCE_TOKEN": token}
    env.pop("GPUFENCE_DATA", None)
    return subprocess.run(
        [sys.executable, "-m", "gpufence", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def job(srv: Server, jid: str) -> dict[str, Any]:
    status, body, _ = call(srv, "GET", f"/v1/jobs/{jid}")
    assert status == 200, body
    return dict(body)


def reason(srv: Server, jid: str) -> str:
    j = job(srv, jid)
    why = j.get("pending") or {}
    return f"{j['state']}: {why.get('reason')}: {why.get('message')}"


SWEEP = """#!/bin/sh
#SBATCH --job-name=sweep
#SBATCH --array=0-2
#SBATCH --gres=gpu:1
#SBATCH --time=00:05:00
#SBATCH --dependency=afterok:{prep}
#SBATCH --output=%A_%a.out
echo "task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID: $(cat prep.done)"
"""


def test_a_slurm_users_session(srv: Server, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    # 1. a token of the user's own, issued by the admin (the secret alone on stdout)
    r = gf(srv, ADMIN, "token", "issue", "--tenant", "team-a")
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    assert token and "\n" not in token

    # 2. an #SBATCH array after its prep job
    r = gf(
        srv, token, "submit", "--cwd", str(work), "--", "sh", "-c", "sleep 1; echo ok > prep.done"
    )
    assert r.returncode == 0, r.stderr
    prep = r.stdout.strip()
    (work / "sweep.sh").write_text(SWEEP.format(prep=prep))
    r = gf(srv, token, "submit", "--cwd", str(work), str(work / "sweep.sh"))
    assert r.returncode == 0, r.stderr
    array = r.stdout.strip()
    for i in range(3):
        out = work / f"{array}_{i}.out"
        until(out.exists, 60, f"{out.name} written")
        until(lambda o=out: o.read_text().strip() != "", 30, f"{out.name} filled")
        assert out.read_text() == f"task {i} of {array}: ok\n"

    # 3. an interactive shell holds its GPU while it runs, and frees it when it exits
    shell = "echo gpus=$CUDA_VISIBLE_DEVICES; sleep 3; exit 7\n"
    env = {**os.environ, "GPUFENCE_URL": srv.url, "GPUFENCE_TOKEN": token}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufence", "run", "--gpus", "1", "--pty", "--", "sh"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdin is not None
    proc.stdin.write(shell)
    proc.stdin.flush()

    def running_pty() -> list[dict[str, Any]]:
        status, body, _ = call(srv, "GET", "/v1/jobs?state=running")
        assert status == 200, body
        return [j for j in body["jobs"] if (j.get("spec") or {}).get("pty")]

    held = until_value(running_pty, bool, 60, "the pty job running")
    assert held[0]["spec"]["gpus"] == 1
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, (out, err)
    assert "gpus=" in out, out
    assert job(srv, held[0]["id"])["state"] != "running"

    # 4. a drained node takes no new work, with the drain named; undrained, it does
    r = gf(srv, ADMIN, "node", "drain", "h100-0", "--reason", "firmware update")
    assert r.returncode == 0, r.stderr
    r = gf(srv, token, "submit", "--gpus", "1", "--", "true")
    assert r.returncode == 0, r.stderr
    waiting = r.stdout.strip()
    until_value(
        lambda: reason(srv, waiting), lambda w: "drained: firmware update" in w, 30, "drain named"
    )
    time.sleep(1)
    assert job(srv, waiting)["state"] == "pending"
    r = gf(srv, ADMIN, "node", "undrain", "h100-0")
    assert r.returncode == 0, r.stderr
    until(lambda: job(srv, waiting)["state"] == "done", 60, "runs once undrained")

    # 5. a maintenance window in 120 s: a 10 s job backfills before it, an unbounded one waits
    r = gf(
        srv,
        ADMIN,
        "reserve",
        "--nodes",
        "h100-0",
        "--start",
        "+120",
        "--duration",
        "600",
        "--reason",
        "rack power",
    )
    assert r.returncode == 0, r.stderr
    r = gf(srv, token, "submit", "--gpus", "1", "--time-limit", "10", "--", "true")
    assert r.returncode == 0, r.stderr
    short = r.stdout.strip()
    r = gf(srv, token, "submit", "--gpus", "1", "--", "true")
    assert r.returncode == 0, r.stderr
    unbounded = r.stdout.strip()
    until(lambda: job(srv, short)["state"] == "done", 60, "the short job ran before the window")
    until_value(lambda: reason(srv, unbounded), lambda w: "rack power" in w, 30, "window named")
    assert job(srv, unbounded)["state"] == "pending"

    # 6. the admin rotates the user's token: the old secret is refused, the new one works
    r = gf(srv, ADMIN, "token", "list", "--tenant", "team-a", "--json")
    assert r.returncode == 0, r.stderr
    tid = _token_id(r.stdout)
    r = gf(srv, ADMIN, "token", "rotate", tid)
    assert r.returncode == 0, r.stderr
    new = r.stdout.strip()
    refused = gf(srv, token, "queue")
    assert refused.returncode != 0, refused
    assert "unauthorized" in refused.stderr and "was rotated" in refused.stderr, refused.stderr
    assert gf(srv, new, "queue").returncode == 0


def _token_id(text: str) -> str:
    rows = json.loads(text)
    rows = rows.get("tokens", rows) if isinstance(rows, dict) else rows
    return str(rows[0]["id"])
