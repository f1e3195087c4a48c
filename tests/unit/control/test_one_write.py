"""one_write.py: a response's head joins its body in one write, and nothing is lost, reordered
or held past the end of the loop's pass, also for a streamed body and a closing connection."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from gpufence.control.http.one_write import HELD_MAX, HeldHead, OneWriteHTTP


class Recorder:
    """What reached the transport under ``HeldHead``, write by write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "a write after close"
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def write_eof(self) -> None:
        self.writes.append(b"<eof>")

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def held(rec: Recorder, loop: asyncio.AbstractEventLoop) -> HeldHead:
    return HeldHead(rec, loop)  # type: ignore[arg-type]


def test_a_head_and_its_body_reach_the_transport_as_one_write() -> None:
    async def go() -> Recorder:
        rec = Recorder()
        t = held(rec, asyncio.get_running_loop())
        t.write(b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n")
        assert rec.writes == [] and t.get_write_buffer_size() > 0
        t.write(b"{}")
        return rec

    rec = asyncio.run(go())
    assert rec.writes == [b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}"]


def test_a_lone_small_write_goes_out_at_the_end_of_the_loops_pass() -> None:
    async def go() -> Recorder:
        rec = Recorder()
        t = held(rec, asyncio.get_running_loop())
        t.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await asyncio.sleep(0)
        assert rec.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
        await asyncio.sleep(0)  # the scheduled flush finds nothing more to send
        return rec

    assert len(asyncio.run(go()).writes) == 1


def test_a_large_write_is_not_held_and_order_is_kept() -> None:
    async def go() -> Recorder:
        rec = Recorder()
        t = held(rec, asyncio.get_running_loop())
        big = b"x" * (HELD_MAX + 1)
        t.write(big)  # nothing held: written at once
        assert rec.writes == [big]
        t.write(b"head")
        t.write(big)  # joins what was held
        t.write(b"tail")
        t.writelines([b"a", b"b"])  # joins "tail"
        await asyncio.sleep(0)
        return rec

    rec = asyncio.run(go())
    big = b"x" * (HELD_MAX + 1)
    assert rec.writes == [big, b"head" + big, b"tailab"]


def test_close_sends_what_is_held_first_and_abort_drops_it() -> None:
    async def go() -> tuple[Recorder, Recorder]:
        loop = asyncio.get_running_loop()
        a, b = Recorder(), Recorder()
        ta, tb = held(a, loop), held(b, loop)
        ta.write(b"last words")
        ta.close()
        tb.write(b"dropped")
        tb.abort()
        await asyncio.sleep(0)  # the scheduled flushes write nothing after close/abort
        assert ta.get_extra_info("peername") == "info:peername"  # the rest is the transport's
        return a, b

    a, b = asyncio.run(go())
    assert a.writes == [b"last words"] and a.closed
    assert b.writes == [] and b.aborted


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    if scope["path"] == "/stream":  # 64 chunks of 64 KiB, each sent on its own
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(64):
            chunk = bytes([65 + i % 26]) * 65536
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = scope["path"].encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def server() -> Iterator[int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(_app, http=OneWriteHTTP, lifespan="off", log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(500):
        if srv.started:
            break
        threading.Event().wait(0.01)
    assert srv.started, "uvicorn did not start"
    yield sock.getsockname()[1]
    srv.should_exit = True
    thread.join(10)


def _read_response(f: Any) -> tuple[bytes, bytes]:
    status = f.readline()
    headers = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while (size := int(f.readline(), 16)) > 0:
            body += f.read(size)
            f.readline()
        f.readline()
        return status, body
    return status, f.read(int(headers["content-length"]))


def test_a_real_uvicorn_answers_keep_alive_requests_and_streams_in_order(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=10) as c:
        f = c.makefile("rb")
        for path in ("/a", "/bb", "/ccc"):  # one keep-alive connection, in turn
            c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert _read_response(f) == (b"HTTP/1.1 200 OK\r\n", path.encode())
        c.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        status, body = _read_response(f)
        assert status == b"HTTP/1.1 200 OK\r\n"
        expected = b"".join(bytes([65 + i % 26]) * 65536 for i in range(64))
        assert body == expected
        c.sendall(b"GET /last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _read_response(f) == (b"HTTP/1.1 200 OK\r\n", b"/last")
        assert f.read() == b""  # closed after what was held went out
