"""Issue 11 (the CLI retries safely): a submit whose answer is lost to a crash of the control
plane keeps trying, with the same Idempotency-Key, through the restart -- so the user gets the
job's id once, and never a second job from submitting again by hand; a submit that reached no
server fails at once; one that gives up says the job may exist and gives the key to use.
Real servers (``gpufence up`` subprocesses, real sockets on 127.0.0.1), the real CLI.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_proc import client, kill9, last_log, stop, up

from gpufence.control.http.client import Client, ClientError
from gpufence.control.store import database as st
from gpufence.testing.crashrun import kill_leftovers

CLI = [sys.executable, "-m", "gpufence"]


def _jobs_in_store(data: Path) -> list[str]:
    with st.Reader(data / st.DB_NAME) as r:
        return [row.id for row in r.jobs(limit=1000)]


@pytest.mark.parametrize("how", ["--data", "export line"])
def test_a_submit_lost_to_a_crash_is_retried_through_the_restart(tmp_path: Path, how: str) -> None:
    """``how`` the CLI finds the server: ``--data`` (DATA/server.json), or the line `gpufence up`
    prints for a shell (GPUFENCE_URL with GPUFENCE_DATA: the URL's port is gone after the
    restart, the data directory's server.json has the new one)."""
    data = tmp_path / "data"
    data.mkdir()
    # the control plane dies right after the submit is committed, before it answers
    server = up(data, env={"GPUFENCE_FAILPOINTS": "reconciler.after-inbox-commit=crash"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFENCE_")}
    args = ["--data", str(data)]
    if how == "export line":
        env |= {"GPUFENCE_URL": client(data).url, "GPUFENCE_DATA": str(data)}
        args = []
    cli = subprocess.Popen(
        [*CLI, "submit", *args, "--", "true"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.wait(30) == -9, last_log(data)
        time.sleep(5)  # the operator (or systemd) restarts it: longer than a few quick tries
        server = up(data)  # a new port: the CLI must find it in DATA/server.json
        out, err = cli.communicate(timeout=60)
        assert cli.returncode == 0, err
        jid = out.strip()
        assert _jobs_in_store(data) == [jid], err  # one job: the retry found the first one
        assert "trying again with the same Idempotency-Key" in err
        assert client(data).job(jid)["id"] == jid
    finally:
        if cli.poll() is None:
            cli.kill()
        stop(server)
        kill_leftovers(data)


def test_a_submit_that_reaches_no_server_fails_at_once(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    r = subprocess.run(
        [*CLI, "submit", "--url", f"http://127.0.0.1:{port}", "--token", "t", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "no gpufence server at" in r.stderr, r.stderr
    assert "Idempotency-Key" not in r.stderr  # nothing was sent: nothing to retry or recover
    assert time.monotonic() - started < 15  # no 30 s of patience for a server that is not there


@pytest.fixture
def hangup_server() -> Iterator[str]:
    """A socket on 127.0.0.1 that reads each request and closes without answering (a control
    plane that dies mid-request, every time)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    done.set()
    srv.close()


def test_a_submit_that_gives_up_names_the_key_to_submit_again_with(hangup_server: str) -> None:
    c = Client(url=hangup_server, token="t")
    tries: list[ClientError] = []
    with pytest.raises(ClientError) as err:
        c.submit({"command": ["true"]}, "my-key-1", patience_s=1.5, on_retry=tries.append)
    assert len(tries) >= 2, tries  # it did retry
    assert "may have been created" in str(err.value)
    assert "--idempotency-key my-key-1" in str(err.value)


def test_the_same_idempotency_key_from_the_cli_gives_the_same_job(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    server = up(data)
    try:
        args = [*CLI, "submit", "--data", str(data), "--idempotency-key", "nightly-42"]
        first = subprocess.run([*args, "--", "true"], capture_output=True, text=True, timeout=60)
        again = subprocess.run([*args, "--", "true"], capture_output=True, text=True, timeout=60)
        assert first.returncode == again.returncode == 0, (first.stderr, again.stderr)
        assert first.stdout == again.stdout and _jobs_in_store(data) == [first.stdout.strip()]
        other = subprocess.run([*args, "--", "false"], capture_output=True, text=True, timeout=60)
        assert other.returncode == 2 and "different request" in other.stderr, other.stderr
        bad = subprocess.run(
            [*CLI, "submit", "--data", str(data), "--idempotency-key", "a b", "--", "true"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert bad.returncode == 2 and "--idempotency-key" in bad.stderr, bad.stderr
    finally:
        kill9(server)
        kill_leftovers(data)
