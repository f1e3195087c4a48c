"""The request-size limit (``control.max_request_bytes``): a body over it gets 413.

``LimitBody`` enforces it for every route FastAPI serves; the submit front (``submission.py``),
which answers ``POST /v1/jobs`` ahead of FastAPI, enforces it with ``too_long`` and ``refuse``:
the same check, the same problem document.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufence.control.http.problems import problem

DRAIN_MAX_BYTES = 64 << 20


def non_json_type(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The request's ``Content-Type`` if it names a body that is not JSON (``text/plain``, a
    form, ...); None when it is JSON (``application/json``, ``*/*+json``) or not given."""
    for name, value in headers:
        if name == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
            if kind and kind != b"application/json" and not kind.endswith(b"+json"):
                return kind.decode("latin-1")
    return None


async def refuse_type(scope: Scope, receive: Receive, send: Send, kind: str) -> None:
    """415 for a body sent as another type than JSON (after reading what is sent)."""
    await read_body(receive, DRAIN_MAX_BYTES)
    resp = problem(
        415, f"the request body must be JSON (Content-Type: application/json), not {kind}"
    )
    await resp(scope, receive, send)


def too_long(content_length: bytes, limit: int) -> bool:
    """A ``Content-Length`` header value over ``limit`` (one that is no number is not: the
    body is counted as it streams)."""
    try:
        return int(content_length) > limit
    except ValueError:
        return False


async def refuse(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
    """The 413, once what the client is still sending has been read (and dropped), up to a
    bound: answering while it writes would reset the connection and it would see a broken
    pipe, not the 413."""
    drained = 0
    while drained <= DRAIN_MAX_BYTES:
        msg = await receive()
        if msg["type"] != "http.request":
            break
        drained += len(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    resp = problem(
        413,
        f"the request body is larger than {limit} bytes (control.max_request_bytes)",
    )
    await resp(scope, receive, send)


async def read_body(receive: Receive, limit: int) -> tuple[bytes, bool | None]:
    """The request body as it streams in, and whether it came whole: True, False when the
    client went away first (what came is returned), None when it grew past ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            return b"".join(chunks), False
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            return b"", None
        chunks.append(chunk)
        if not msg.get("more_body"):
            return b"".join(chunks), True


class LimitBody:
    """ASGI middleware: a request body over ``limit`` bytes gets 413 before any route sees it
    (``Content-Length`` is checked first; a chunked body is counted as it streams)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and too_long(value, self.limit):
                await refuse(scope, receive, send, self.limit)
                return
        kind = non_json_type(scope.get("headers", ())) if scope["method"] != "GET" else None
        if kind is not None:
            await refuse_type(scope, receive, send, kind)
            return
        whole, complete = await read_body(receive, self.limit)
        if complete is None:
            await refuse(scope, receive, send, self.limit)
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
