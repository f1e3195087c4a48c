"""A data dir whose server is not running never sends its admin token to the default port
(issue 32, case 2), and errors from a server name the server asked.

A real HTTP listener on 127.0.0.1:7878 (the client's built-in default URL) records every
request and its Authorization header, standing in for another user's plane on a shared machine;
the real CLI runs against a data dir with an ``admin.token`` and no ``server.json``.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from api_helpers import Server

from gpufence.control.http.client import DEFAULT_URL

TOKEN = "admin-token-of-the-stopped-plane-0123456789"
PORT = int(DEFAULT_URL.rsplit(":", 1)[1])


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def _answer(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        body = b'{"detail": "invalid token"}'
        self.send_response(401)
        self.send_header("Content-Type", "application/problem+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def default_port_listener() -> Iterator[list[tuple[str, str | None]]]:
    try:
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), _Recorder)
    except OSError as exc:
        pytest.skip(f"127.0.0.1:{PORT} is in use ({exc.strerror}): cannot stand in for it")
    _Recorder.seen = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield _Recorder.seen
    finally:
        srv.shutdown()
        srv.server_close()


def _gpufence(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufence", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFENCE_")}
    # no client context either: another test's `gpufence up` made one current in the shared
    # $XDG_CONFIG_HOME, and it would name that (gone) server instead of the default
    config = home / ".config"
    return {**env, "HOME": str(home), "XDG_CONFIG_HOME": str(config), **extra}


def _stopped_plane(where: Path) -> Path:
    where.mkdir(parents=True)
    (where / "admin.token").write_text(TOKEN + "\n")
    return where


@pytest.mark.parametrize(
    "how", ["--data", "GPUFENCE_DATA", "~/.gpufence", "submit --data", "--data --token"]
)
def test_a_stopped_planes_token_never_goes_to_the_default_port(
    default_port_listener: list[tuple[str, str | None]], tmp_path: Path, how: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    if how == "~/.gpufence":
        data = _stopped_plane(home / ".gpufence")
        r = _gpufence("queue", env=_env(home))
    else:
        data = _stopped_plane(tmp_path / "data")
        if how == "GPUFENCE_DATA":
            r = _gpufence("queue", env=_env(home, GPUFENCE_DATA=str(data)))
        elif how == "submit --data":
            r = _gpufence("submit", "--data", str(data), "--", "true", env=_env(home))
        elif how == "--data --token":
            r = _gpufence("queue", "--data", str(data), "--token", "t" * 20, env=_env(home))
        else:
            r = _gpufence("queue", "--data", str(data), env=_env(home))
    assert default_port_listener == [], default_port_listener  # nothing sent, no token
    assert r.returncode == 1, (r.stdout, r.stderr)
    flat = " ".join(r.stderr.split())
    assert f"no gpufence server is running for the data dir {data}" in flat, flat
    assert f"gpufence up --data {data}" in flat, flat
    assert "Traceback" not in r.stderr


def test_an_explicit_url_still_reaches_the_default_port(
    default_port_listener: list[tuple[str, str | None]], tmp_path: Path
) -> None:
    """--url is the user's own choice (and its token): sent, and the refusal names the server."""
    r = _gpufence("queue", "--url", DEFAULT_URL, "--token", "t" * 20, env=_env(tmp_path))
    assert [auth for _, auth in default_port_listener] == [f"Bearer {'t' * 20}"]
    assert r.returncode == 1
    assert f"unauthorized by {DEFAULT_URL}: invalid token" in " ".join(r.stderr.split())


def test_a_real_servers_refusal_names_the_server(server: Server, tmp_path: Path) -> None:
    env = _env(tmp_path)
    r = _gpufence("queue", "--url", server.url, "--token", "wrong-token-1234", env=env)
    assert r.returncode == 1
    assert f"unauthorized by {server.url}:" in " ".join(r.stderr.split()), r.stderr


def test_the_python_client_keeps_the_token_too(
    default_port_listener: list[tuple[str, str | None]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Client(data_dir=...)`` (the API's Python client) guards the same way."""
    from gpufence.control.http.client import Client, ClientError

    for name in ("GPUFENCE_URL", "GPUFENCE_TOKEN", "GPUFENCE_DATA"):
        monkeypatch.delenv(name, raising=False)
    data = _stopped_plane(tmp_path / "data")
    with pytest.raises(ClientError, match="no gpufence server is running for the data dir"):
        Client(data_dir=data).jobs()
    assert default_port_listener == []
