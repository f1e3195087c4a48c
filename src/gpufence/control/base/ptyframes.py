"""The frames a pty job's host (``ptyhost.py``) and the server's relay (``http/pty_routes.py``)
exchange over the host's Unix socket.

A frame is one type byte, a 4-byte big-endian payload length, the payload:

* ``d`` data: terminal input (to the host) or output (from it), raw bytes;
* ``r`` resize (to the host): rows and columns, two big-endian unsigned shorts;
* ``x`` exit (from the host, last): the command's exit code as ASCII digits (128 + N when a
  signal N killed it).

Standard library only: the host is part of the launcher, which the Ray node agent runs by path
with ``python -I -S``.
"""

from __future__ import annotations

import struct

DATA = b"d"
RESIZE = b"r"
EXIT = b"x"
KINDS = frozenset({DATA, RESIZE, EXIT})
HEADER = struct.Struct("!cI")
MAX_PAYLOAD = 1 << 20
"""Larger frames are a protocol error: the peer is dropped, never buffered without a bound."""


class FrameError(ValueError):
    """A frame of an unknown kind, or longer than ``MAX_PAYLOAD``."""


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def resize_frame(rows: int, cols: int) -> bytes:
    return frame(RESIZE, struct.pack("!HH", min(max(rows, 1), 0xFFFF), min(max(cols, 1), 0xFFFF)))


def parse_resize(payload: bytes) -> tuple[int, int]:
    if len(payload) != 4:
        raise FrameError(f"a resize frame has 4 bytes, not {len(payload)}")
    rows, cols = struct.unpack("!HH", payload)
    return int(rows), int(cols)


class FrameReader:
    """Splits a byte stream into ``(kind, payload)`` frames as its pieces arrive."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """The frames ``data`` completes (FrameError on a malformed one)."""
        self._buf += data
        out: list[tuple[bytes, bytes]] = []
        while len(self._buf) >= HEADER.size:
            kind, size = HEADER.unpack_from(self._buf)
            if kind not in KINDS or size > MAX_PAYLOAD:
                raise FrameError(f"bad frame (kind {kind!r}, {size} bytes)")
            end = HEADER.size + size
            if len(self._buf) < end:
                break
            out.append((kind, bytes(self._buf[HEADER.size : end])))
            del self._buf[:end]
        return out
