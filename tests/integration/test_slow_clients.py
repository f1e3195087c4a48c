"""A hostile local tenant's slow-loris: connections that never finish a request head are closed,
and requests being served are not. Real server on 127.0.0.1, raw sockets."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_helpers import ADMIN, Server, call, run_server

from gpufence.control.http import slow_clients


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    monkeypatch.setattr(slow_clients, "HEAD_TIMEOUT_S", 1.0)
    monkeypatch.setattr(slow_clients, "CHECK_S", 0.2)
    yield from run_server(tmp_path)


def _connect(server: Server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _closed(sock: socket.socket, within_s: float) -> bool:
    """The server closed the connection (EOF) within ``within_s``; trickling a header byte
    every 0.3 s as a slow-loris does."""
    end = time.monotonic() + within_s
    sock.settimeout(0.3)
    while time.monotonic() < end:
        try:
            sock.sendall(b"X")
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset / broken pipe: closed too
            return True
    return False


def test_a_request_head_that_never_ends_is_closed(server: Server) -> None:
    sock = _connect(server)
    try:
        sock.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n")
        assert _closed(sock, 10.0)
    finally:
        sock.close()


def test_a_connection_that_sends_nothing_is_closed(server: Server) -> None:
    sock = _connect(server)
    try:
        sock.settimeout(10)
        assert sock.recv(1) == b""
    finally:
        sock.close()


def test_kept_alive_connections_and_slow_requests_still_work(server: Server) -> None:
    sock = _connect(server)
    try:
        head = f"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\n\r\n"
        for _ in range(3):  # one connection, several requests, each well within the limit
            sock.sendall(head.encode())
            sock.settimeout(10)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(0.5)
    finally:
        sock.close()
    assert call(server, "GET", "/healthz", token=None)[0] == 200


def test_a_body_that_trickles_in_is_cut_and_submits_nothing(server: Server) -> None:
    sock = _connect(server)
    try:
        head = (
            "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {ADMIN}\r\nContent-Length: 100000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"command": ["true"], "name": "')
        assert _closed(sock, 10.0)
    finally:
        sock.close()
    status, out, _ = call(server, "GET", "/v1/jobs?limit=100")
    assert status == 200 and out["jobs"] == [], out
