"""The client's end of a job's terminal: a WebSocket to ``/v1/jobs/{id}/pty``
(``control/http/pty_routes.py`` says what travels on it), spoken with ``wsproto`` over a plain
socket (TLS for an ``https`` server) -- no event loop, so ``pty_session.py`` can ``select`` on
it beside the user's terminal.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import urllib.parse
from dataclasses import dataclass

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError

CONNECT_TIMEOUT_S = 30.0


class LinkRefused(Exception):
    """The server answered the upgrade with an error (``status``: its HTTP status)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


@dataclass
class Output:
    """What one read brought: terminal bytes, the command's exit code once it exited, and
    whether the link is closed (``reason``: why, when it closed without an exit)."""

    data: bytes = b""
    exit_code: int | None = None
    closed: bool = False
    reason: str = ""


class TerminalLink:
    def __init__(self, sock: socket.socket, ws: WSConnection) -> None:
        self.sock = sock
        self._ws = ws
        self._text = ""

    @classmethod
    def open(cls, base_url: str, token: str, job_id: str) -> TerminalLink:
        """Connect and upgrade; ``LinkRefused`` with the server's problem detail if refused."""
        url = urllib.parse.urlsplit(base_url)
        port = url.port or (443 if url.scheme == "https" else 80)
        host = url.hostname or "127.0.0.1"
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        if url.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        ws = WSConnection(ConnectionType.CLIENT)
        target = f"{url.path.rstrip('/')}/v1/jobs/{urllib.parse.quote(job_id, safe='')}/pty"
        auth = (b"authorization", f"Bearer {token}".encode())
        sock.sendall(ws.send(Request(host=url.netloc, target=target, extra_headers=[auth])))
        try:
            cls._handshake(sock, ws)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return cls(sock, ws)

    @staticmethod
    def _handshake(sock: socket.socket, ws: WSConnection) -> None:
        status, body = 0, b""
        while True:
            data = sock.recv(65536)
            ws.receive_data(data or None)
            for event in ws.events():
                if isinstance(event, AcceptConnection):
                    return
                if isinstance(event, RejectConnection):
                    status = event.status_code
                    if not event.has_body:
                        raise LinkRefused(status, f"refused ({status})")
                elif isinstance(event, RejectData):
                    body += event.data
                    if event.body_finished:
                        raise LinkRefused(status, _detail(body, status))
            if not data:
                raise LinkRefused(status or 502, "the server closed the connection")

    def send_input(self, data: bytes) -> None:
        self.sock.sendall(self._ws.send(BytesMessage(data=data)))

    def send_resize(self, rows: int, cols: int) -> None:
        text = json.dumps({"resize": [rows, cols]})
        self.sock.sendall(self._ws.send(TextMessage(data=text)))

    def buffered(self) -> Output:
        """What came with the upgrade's answer (already read off the socket)."""
        out = Output()
        for event in self._ws.events():
            self._take(event, out)
        return out

    def read(self) -> Output:
        """One read of the socket (call it when it is readable)."""
        try:
            data = self.sock.recv(65536)
        except OSError as exc:
            return Output(closed=True, reason=str(exc))
        self._ws.receive_data(data or None)
        out = Output(closed=not data, reason="" if data else "the connection was lost")
        for event in self._ws.events():
            self._take(event, out)
        return out

    def _take(self, event: object, out: Output) -> None:
        if isinstance(event, BytesMessage):
            out.data += bytes(event.data)
        elif isinstance(event, TextMessage):
            self._text += event.data
            if event.message_finished:
                text, self._text = self._text, ""
                code = json.loads(text).get("exit")
                if isinstance(code, int):
                    out.exit_code = code
        elif isinstance(event, Ping):
            self.sock.sendall(self._ws.send(event.response()))
        elif isinstance(event, CloseConnection):
            out.closed = True
            out.reason = event.reason or f"closed ({event.code})"
            # closing: the peer may be gone already, or the close already answered
            with contextlib.suppress(OSError, LocalProtocolError):
                self.sock.sendall(self._ws.send(event.response()))

    def close(self) -> None:
        self.sock.close()


def _detail(body: bytes, status: int) -> str:
    try:
        problem = json.loads(body)
        return str(problem.get("detail") or problem.get("title") or status)
    except ValueError:
        return body.decode(errors="replace").strip() or f"refused ({status})"
