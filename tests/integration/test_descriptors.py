"""Descriptor exhaustion (issue 30, case 6) on a real ``gpufence up`` whose file limit is 1024
(soft and hard, so raising it cannot help): 1,100 idle connections from one client must not
stop ``/healthz``, a submit, or the start of the job. Connections over the cap close the
longest-idle ones; an over-cap connection when all are busy gets 503."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from server_proc import serving

from gpufence.control.base.config import ADMIN, cluster_from_spec_dict, control_config
from gpufence.control.base.executor import Launch, LaunchError
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.executors.local.local_executor import LocalExecutor
from gpufence.control.gpus.discovery import fake_gpus, node_spec
from gpufence.control.http.client import Client
from gpufence.control.plane import ControlPlane
from gpufence.control.store import database as st
from gpufence.testing.crashrun import kill_leftovers
from gpufence.testing.waiting import until

LIMIT = 1024


def _limited() -> None:  # pragma: no cover - runs in the child before exec
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def test_idle_connections_past_the_file_limit_starve_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cmd = [sys.executable, "-m", "gpufence", "up", "--fake-gpus", "1", "--data", str(data)]
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(
        [*cmd, "--port", "0"], stdout=log, stderr=subprocess.STDOUT, preexec_fn=_limited
    )
    conns: list[socket.socket] = []
    try:
        until(lambda: serving(data) == proc.pid or proc.poll() is not None, 60, "server up")
        assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
        url = json.loads((data / "server.json").read_text())["url"]
        port = int(url.rsplit(":", 1)[1])
        for _ in range(1100):
            s = socket.socket()
            s.settimeout(5)
            s.connect(("127.0.0.1", port))
            conns.append(s)
        time.sleep(0.5)
        with urllib.request.urlopen(url + "/healthz", timeout=10) as resp:
            assert resp.status == 200
        c = Client(data_dir=data)
        jid = str(c.submit({"command": ["true"], "gpus": 1})["id"])
        until(lambda: c.job(jid)["state"] in ("done", "failed"), 30, "the job ended")
        assert c.job(jid)["state"] == "done", c.job(jid)
        # the cap closed the longest-idle ones: no more are open than it allows
        from gpufence.control.http.slow_clients import Caps

        closed = 0
        for s in conns:
            s.settimeout(0.01)
            with contextlib.suppress(TimeoutError, OSError):
                closed += s.recv(1) == b""
        assert closed >= 1100 - Caps.for_limit(LIMIT).per_client
    finally:
        for s in conns:
            s.close()
        proc.terminate()
        proc.wait(30)
        log.close()
        kill_leftovers(data)


def test_caps_leave_descriptors_for_the_plane() -> None:
    from gpufence.control.http.slow_clients import Caps

    small, big = Caps.for_limit(1024), Caps.for_limit(1 << 20)
    assert small.total <= 1024 - 256 and small.per_client < small.total
    assert big.total == 16384 and big.per_client < big.total


class _OutOfDescriptorsOnce(LocalExecutor):
    """The local executor whose first start fails as at the file limit (EMFILE)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def start(self, launch: Launch) -> None:
        if not self.failed:
            self.failed = True
            try:
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            except OSError as exc:
                raise LaunchError(f"job {launch.job_id}: cannot start rank 0: {exc}") from exc
        super().start(launch)


def test_a_launch_that_failed_for_lack_of_descriptors_is_retried(tmp_path: Path) -> None:
    """Not failed for good (shown as an incident): requeued as the next attempt, which runs,
    and the job's message names the real reason."""
    data = tmp_path / "data"
    cfg = control_config({"stop_grace_s": 1}, data)
    ex = _OutOfDescriptorsOnce()
    p = ControlPlane(
        cluster_from_spec_dict(node_spec(fake_gpus(1))), cfg, fake_gpus(1), data, executor=ex
    )
    p.start()
    try:
        req = SubmitRequest.model_validate({"command": ["true"], "gpus": 1})
        jid = p.submit(req, ADMIN).job_id
        until(lambda: (r := p.job(jid, ADMIN)) is not None and r.state in st.TERMINAL, 30, "end")
        row = p.job(jid, ADMIN)
        assert row is not None and ex.failed
        assert (row.state, row.attempt) == (st.DONE, 2), row
        events = " ".join(str(e) for e in p.events(ADMIN, job_id=jid)) + row.message
        assert "Too many open files" in events, events
    finally:
        p.close(kill_jobs=True)
