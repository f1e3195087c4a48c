"""``GET /v1/jobs/{id}/pty`` (WebSocket): the terminal of a running pty job, for
``gpufence run --pty`` and ``gpufence attach``.

Authenticated as every ``/v1`` route (``Authorization: Bearer``): the job's tenant or the admin.
Refusals are HTTP answers to the upgrade request, RFC 7807 documents as elsewhere: 401 no or a
bad token, 403 another tenant's job, 404 an unknown one, 409 a job that is not a pty job or not
running (yet, or any more).

Messages: binary, both ways, are the terminal's bytes; text from the client is JSON
``{"resize": [rows, cols]}``; the server's last message is the text ``{"exit": CODE}`` when the
command has exited (then a normal close). A client that goes away does not end the job: its
host (``base/ptyhost.py``) hangs the session up when nobody has been attached for the job's
``pty_grace_s``.

The relay talks to that host over ``attempt-N.records/pty.sock`` (``base/ptyframes.py``). The
host runs as the control plane's user (not the job's: ``base/ptyhost.py``) and the socket is in
the control plane's records directory, which no job can write. Before it relays a byte the server
checks both: the directory it connected through is its own user's and writable by nobody else,
and the peer (``SO_PEERCRED``) runs as its own user, so a socket or link a job made (as its
tenant's user) is never taken for the terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, HTTPException, WebSocket, WebSocketDisconnect, status
from starlette.concurrency import run_in_threadpool

from gpufence.control.base.member_records import pty_socket
from gpufence.control.base.ptyframes import (
    DATA,
    EXIT,
    FrameError,
    FrameReader,
    frame,
    resize_frame,
)
from gpufence.control.http.auth import one_header, tenant_of_header
from gpufence.control.http.jobs_routes import row_of
from gpufence.control.http.problems import problem
from gpufence.control.plane import ControlPlane
from gpufence.control.plane.control_plane import AccessError
from gpufence.control.store import rows as st

LIVE = ("starting", "running", "stopping")
CONNECT_WAIT_S = 10.0
"""How long a starting job's terminal may take to appear (its host binds the socket)."""
_UCRED = struct.Struct("3i")  # pid, uid, gid


class Refused(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def pty_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter()

    @router.websocket("/v1/jobs/{job_id}/pty")
    async def pty(websocket: WebSocket, job_id: str) -> None:
        try:
            tenant = tenant_of_header(
                plane.config, one_header(websocket.headers.getlist("authorization"))
            )
            row = await run_in_threadpool(_pty_job, plane, job_id, tenant)
            sock = await _connect(plane, row)
        except HTTPException as exc:
            await websocket.send_denial_response(problem(exc.status_code, str(exc.detail)))
            return
        except (AccessError, Refused) as exc:
            code = status.HTTP_403_FORBIDDEN if isinstance(exc, AccessError) else exc.code
            await websocket.send_denial_response(problem(code, str(exc)))
            return
        await websocket.accept()
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        try:
            await _relay(websocket, reader, writer)
        finally:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()

    return router


def _pty_job(plane: ControlPlane, job_id: str, tenant: str) -> st.JobRow:
    row = row_of(plane, job_id, tenant)  # 404 unknown, AccessError another tenant's
    if not row.spec.get("pty"):
        raise Refused(409, f"{job_id} is not a pty job (submit it with `gpufence run --pty`)")
    if row.state not in LIVE:
        why = row.reason or row.state
        raise Refused(409, f"{job_id} is {row.state} ({why}): its terminal is not open")
    return row


async def _connect(plane: ControlPlane, row: st.JobRow) -> socket.socket:
    """A connection to the job's terminal host, checked to be the control plane's own."""
    path = pty_socket(plane.data_dir / "jobs" / row.id / f"attempt-{row.attempt}")
    uid = os.geteuid()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CONNECT_WAIT_S
    while True:
        try:
            return await run_in_threadpool(_connect_checked, str(path), uid)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            if loop.time() > deadline:
                raise Refused(409, f"{row.id}: its terminal did not open") from None
            await asyncio.sleep(0.1)


def _connect_checked(path: str, uid: int) -> socket.socket:
    """Connect through the directory's descriptor (the path may exceed a socket address's
    108 bytes); refuse a directory that is not ``uid``'s alone or a peer that is not ``uid``'s."""
    directory, name = os.path.split(path)
    dfd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        st = os.fstat(dfd)
        if st.st_uid != uid or st.st_mode & 0o022:
            raise Refused(409, "the job's terminal is in a directory others may write: refused")
        sock.settimeout(2.0)
        sock.connect(f"/proc/self/fd/{dfd}/{name}")
        _pid, peer_uid, _gid = _UCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        )
        if peer_uid != uid:
            raise Refused(409, "the job's terminal socket is not its host's: refused")
        sock.setblocking(False)
        return sock
    except BaseException:
        sock.close()
        raise
    finally:
        os.close(dfd)


async def _relay(ws: WebSocket, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Bytes both ways until the command exits or either side goes away."""
    up = asyncio.create_task(_client_to_host(ws, writer))
    try:
        await _host_to_client(ws, reader)
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass  # the client went away while output was on its way: the host keeps the session
    finally:
        up.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await up


async def _host_to_client(ws: WebSocket, reader: asyncio.StreamReader) -> None:
    frames = FrameReader()
    while True:
        data = await reader.read(65536)
        if not data:  # the host went away without an exit (killed): the job's end says how
            with contextlib.suppress(Exception):
                await ws.close(code=1011, reason="the job's terminal closed")
            return
        try:
            parsed = frames.feed(data)
        except FrameError:
            await ws.close(code=1011, reason="bad frame from the job's terminal")
            return
        for kind, payload in parsed:
            if kind == DATA:
                await ws.send_bytes(payload)
            elif kind == EXIT:
                await ws.send_text(json.dumps({"exit": int(payload or b"0")}))
                await ws.close(code=1000)
                return


async def _client_to_host(ws: WebSocket, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                break
            out = _host_frame(msg)
            if out is None:
                continue
            writer.write(out)
            await writer.drain()
    writer.close()  # the host counts its clients by their connections


def _host_frame(msg: Mapping[str, Any]) -> bytes | None:
    """The host's frame for one client message (None: nothing to send, e.g. bad JSON)."""
    if msg.get("bytes") is not None:
        return frame(DATA, msg["bytes"])
    try:
        rows, cols = json.loads(msg.get("text") or "")["resize"]
        return resize_frame(int(rows), int(cols))
    except (ValueError, KeyError, TypeError):
        return None
