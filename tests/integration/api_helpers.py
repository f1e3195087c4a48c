"""A real ``serve`` on 127.0.0.1 for the API tests: one per module (8 fake GPUs, two tenants).

``serve`` runs in a thread on port 0 with a tmp data dir and a config whose ``control.auth`` has
an admin token and two tenants; ``call`` is a tiny HTTP client that returns status, body, headers.
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

from gpufence.control.base.config import SERVER_FILE
from gpufence.control.http.server import build_plane, serve
from gpufence.control.plane import ControlPlane
from gpufence.testing.waiting import until_value

ADMIN = "admin-token-0123456789"
TOKEN_A = "tenant-a-token-0123"
TOKEN_B = "tenant-b-token-0123"

NODES = """node_groups:
  - name: h100
    count: 1
    gpus_per_node: 8
    gpu_type: H100-80GB
    nvlink_domains: [8]"""
"""One node of 8 fake H100s (the ``h100`` group), for the servers' cluster specs."""

CONFIG = f"""
name: api-test
{NODES}
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
  # test servers under pytest's 0700 tmp dirs, jobs from root's venv: explicitly root
  tenants:
    team-a: {{run_as: root, allow_root: true}}
    team-b: {{run_as: root, allow_root: true}}
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


def run_server(root: Path, config: str = CONFIG) -> Iterator[Server]:
    cfg = root / "cluster.yaml"
    cfg.write_text(config, encoding="utf-8")
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
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, Any]:
    """(status, parsed JSON or text, headers); ``raw`` sends those bytes as the JSON body."""
    headers = dict(headers or {})
    data = raw
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if body is not None:
        data = json.dumps(body).encode()
    if data is not None:
        headers.setdefault("Content-Type", "application/json")
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
