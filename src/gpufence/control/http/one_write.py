"""A response's head and body in one write: one TCP segment and one wake-up of the client.

uvicorn writes a response's head (status line and headers) when the app sends
``http.response.start`` and its body when the app sends ``http.response.body``: two ``send``
syscalls, two segments on the wire (``TCP_NODELAY``), and a client that is woken by the head
only to wait again for the body. On the submit path that second loopback round is ~5 % of the
server's CPU per submit and more of the client's.

``HeldHead`` sits between uvicorn's protocol and the real transport and holds back one small
write (a head is a few hundred bytes) until the next write or the end of the current pass of
the event loop, whichever comes first. Only one small write is ever held, so a streamed
response (a log download) still flows at the transport's pace and its flow control still
holds; nothing is reordered, and ``close`` sends what is held first.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.auto import AutoHTTPProtocol

HELD_MAX = 8192  # bytes: a head; anything larger is written at once


class HeldHead:
    """A transport that delays one small write to join it with the next."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + bytes(data))
        elif len(data) <= HELD_MAX:
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Write what is held (nothing if the next write took it)."""
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause_reading, ...
        return getattr(self._transport, name)


class OneWriteHTTP(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP/1.1 protocol (httptools where installed, else h11) over ``HeldHead``."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        held = HeldHead(cast(asyncio.Transport, transport), asyncio.get_running_loop())
        super().connection_made(held)
