"""A real ``gpufence up`` process for the tenant isolation tests, and HTTP helpers for it.

The server runs as its own process (root), so what it creates is what production creates: its
umask, its files. The data dir lives under a fresh ``/tmp/gpufence-tenants-*`` (mode 0711) rather
than pytest's ``tmp_path``, whose 0700 parents no run_as user could pass through.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CGROUP_PARENT = f"/gpufence-tenants-{os.getpid()}-{secrets.token_hex(3)}"
"""The servers' cgroup parent (``control.containment.cgroup_parent``): this test process's own,
removed by the server when it stops."""
JOB_PY = "/usr/bin/python3"
"""The jobs' interpreter: readable by every user (the venv's lives under /root, mode 0700)."""


@dataclass
class Server:
    url: str
    data: Path
    root: Path
    tokens: dict[str, str] = field(default_factory=dict)  # tenant -> clear token

    def call(
        self, method: str, path: str, tenant: str = "admin", body: Any = None
    ) -> tuple[int, Any, Any]:
        """(status, parsed JSON or bytes, headers)."""
        headers = {"Authorization": f"Bearer {self.tokens[tenant]}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, raw, hdrs = resp.status, resp.read(), resp.headers
        except urllib.error.HTTPError as exc:
            status, raw, hdrs = exc.code, exc.read(), exc.headers
        return status, json.loads(raw) if "json" in hdrs.get("content-type", "") else raw, hdrs

    def submit(self, tenant: str, code: str, **fields: Any) -> str:
        body = {"command": [JOB_PY, "-c", code], "cwd": "/", **fields}
        status, out, _ = self.call("POST", "/v1/jobs", tenant, body)
        assert status == 201, out
        job_id: str = out["id"]
        return job_id

    def wait(self, job_id: str, states: tuple[str, ...], timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            status, job, _ = self.call("GET", f"/v1/jobs/{job_id}")
            assert status == 200, job
            if job["state"] in states:
                out: dict[str, Any] = job
                return out
            assert time.monotonic() < deadline, f"{job_id} stuck in {job['state']}: {job}"
            time.sleep(0.05)

    def log(self, job_id: str, tenant: str = "admin", stream: str = "out") -> bytes:
        status, body, _ = self.call("GET", f"/v1/jobs/{job_id}/logs?stream={stream}", tenant)
        assert status == 200, body
        return body if isinstance(body, bytes) else json.dumps(body).encode()


def private_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix=f"gpufence-tenants-{os.getpid()}-"))
    os.chmod(root, 0o711)  # scaffolding: run_as users must reach DATA below it
    return root


@contextlib.contextmanager
def gpufence_up(
    root: Path, config: str, env: dict[str, str], tokens: dict[str, str], gpus: int = 4
) -> Iterator[Server]:
    cfg = root / "cluster.yaml"
    cfg.write_text(config, encoding="utf-8")
    data = root / "data"
    log = (root / "server.log").open("wb")
    cmd = [sys.executable, "-m", "gpufence", "up", "--config", str(cfg), "--data", str(data)]
    cmd += ["--fake-gpus", str(gpus), "--port", "0", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    try:
        deadline = time.monotonic() + 60
        info = data / "server.json"
        while not info.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"gpufence up did not start:\n{_tail(root)}")
            time.sleep(0.05)
        url = json.loads(info.read_text())["url"]
        tokens = {**tokens}
        if "admin" not in tokens:
            tokens["admin"] = (data / "admin.token").read_text().strip()
        yield Server(url, data, root, tokens)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _tail(root: Path) -> str:
    try:
        return (root / "server.log").read_text(errors="replace")[-4000:]
    except OSError:
        return "(no log)"


def remove(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
