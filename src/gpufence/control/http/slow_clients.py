"""Connections that send no complete request are closed (slow-loris).

uvicorn closes a connection that stays idle after a response (``timeout_keep_alive``), but not
one that never finishes a request head: any byte cancels its keep-alive timer, and there is no
header timeout. A local tenant could then hold a socket (a file descriptor of the control plane)
per connection, as many as it likes, by sending a byte every few seconds.

``guarded(protocol)`` extends uvicorn's HTTP protocol class (h11 or httptools: whichever the
server uses) with one timer per connection: every ``CHECK_S`` it looks whether a request is in
flight (its ``cycle`` has not completed its response). A connection with none in flight for
``HEAD_TIMEOUT_S`` -- since it was opened or since its last response -- is closed: a client that
is sending a request head has had that long to finish it. So is one whose request body is still
coming ``HEAD_TIMEOUT_S`` after its head (the limit is 1 MiB: seconds at any honest speed).
Requests being served (their body in) are never cut.

It also caps how many connections are open at once (issue 30, case 6: every idle connection
is a descriptor of the control plane's, and at the file limit the plane could neither answer
``/healthz`` nor start a job): at most ``Caps.total`` in all and ``Caps.per_client`` from one
client address. A new connection over a cap first makes room by closing the longest-idle
connection (none of its requests in flight) -- of its own address for the per-client cap --
and is answered ``503`` and closed only when every one is busy. ``raise_file_limit`` lifts the
soft descriptor limit to the hard one at start; ``Caps.for_limit`` keeps the caps well below
what is left, so jobs, logs and the store always have descriptors.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("gpufence.http")

HEAD_TIMEOUT_S = 30.0
"""How long a connection may go without a complete request (its head) being in flight."""
CHECK_S = 5.0


RESERVED_FDS = 512
"""Descriptors kept out of the connection caps: the store, logs, pidfds, job launches."""
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: 71\r\n\r\n"
    b'{"detail":"too many connections: every one is busy; retry in a second"}'
)


@dataclass(frozen=True)
class Caps:
    total: int
    per_client: int

    @classmethod
    def for_limit(cls, nofile: int) -> Caps:
        """Caps that leave ``RESERVED_FDS`` (or half, on a small limit) of ``nofile``."""
        total = max(16, min(nofile - RESERVED_FDS, nofile // 2 + nofile // 4, 16384))
        return cls(total, max(8, total * 3 // 4))


def raise_file_limit() -> int:
    """Lift the soft descriptor limit to the hard one (logged); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            log.info("file descriptor limit raised from %d to %d", soft, hard)
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the file descriptor limit from %d: %s", soft, exc)
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


def make_room(open_: dict[int, Any], peer: str | None, caps: Caps) -> bool:
    """Room for one more connection from ``peer`` under both caps, closing the longest-idle
    connections to make it; False if the pool over its cap has none idle."""
    mine = [c for c in open_.values() if c._peer == peer]
    for pool, cap in ((mine, caps.per_client), (list(open_.values()), caps.total)):
        if len(pool) < cap:
            continue
        idle = [c for c in pool if c._idle()]
        if not idle:
            log.warning("connection from %s refused: %d open, all busy", peer, cap)
            return False
        oldest = min(idle, key=lambda c: c._idle_since)
        open_.pop(id(oldest), None)
        oldest.transport.close()
    return True


def _is_idle(conn: Any) -> bool:
    """No request in flight; never a WebSocket's (upgraded) connection, busy while open."""
    if conn._upgraded:
        return False
    cycle: Any = conn.cycle
    return cycle is None or bool(cycle.response_complete)


def _watch_upgraded(conn: Any, open_: dict[int, Any]) -> None:
    """Keep an upgraded connection counted until its transport closes."""
    if conn.transport.is_closing():
        open_.pop(id(conn), None)
    else:
        conn._guard = conn.loop.call_later(CHECK_S, _watch_upgraded, conn, open_)


def guarded(protocol: type[Any], caps: Caps | None = None) -> type[Any]:
    """``protocol`` (a uvicorn HTTP protocol class) that closes slow-loris connections and
    keeps to ``caps`` (default: from this process's descriptor limit)."""
    limits = caps or Caps.for_limit(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    open_: dict[int, Any] = {}  # id -> connection: this server's, in the order opened

    class Guarded(protocol):  # type: ignore[misc]
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._idle_since = self._began = self.loop.time()
            self._seen_cycle: Any = None
            self._upgraded = False
            self._guard = self.loop.call_later(CHECK_S, self._check)
            peer = transport.get_extra_info("peername")
            self._peer = peer[0] if isinstance(peer, tuple) and peer else None
            if not make_room(open_, self._peer, limits):
                transport.write(BUSY)
                transport.close()
                return
            open_[id(self)] = self

        def _idle(self) -> bool:
            return _is_idle(self)

        def _check(self) -> None:
            now = self.loop.time()
            cycle: Any = self.cycle
            if cycle is not self._seen_cycle:  # a request came since the last look
                self._seen_cycle = cycle
                self._idle_since = self._began = now
            elif cycle is not None and not cycle.response_complete:
                if not getattr(cycle, "more_body", False):
                    self._idle_since = now  # being served: never cut
                elif now - self._began >= HEAD_TIMEOUT_S:
                    self.transport.close()  # its body has trickled in for that long
                    return
            elif now - self._idle_since >= HEAD_TIMEOUT_S:
                self.transport.close()
                return
            self._guard = self.loop.call_later(CHECK_S, self._check)

        def handle_websocket_upgrade(self, *args: Any) -> None:
            # the connection is a WebSocket's from here on (a terminal, ``pty_routes.py``),
            # with a protocol object of its own: no request head to wait for, so it is never
            # cut as idle; it still counts against the caps until its transport closes (this
            # object never hears of its end: ``_watch_upgraded`` looks)
            self._upgraded = True
            self._guard.cancel()
            self._guard = self.loop.call_later(CHECK_S, _watch_upgraded, self, open_)
            super().handle_websocket_upgrade(*args)

        def connection_lost(self, exc: Exception | None) -> None:
            self._guard.cancel()
            open_.pop(id(self), None)
            super().connection_lost(exc)

    Guarded.__name__ = f"Guarded{protocol.__name__}"
    return Guarded


def http_protocol(caps: Caps | None = None) -> type[Any]:
    """The protocol class uvicorn's ``http="auto"`` would pick, guarded."""
    try:
        import httptools  # noqa: F401  (what "auto" checks)
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return guarded(HttpToolsProtocol, caps)
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return guarded(H11Protocol, caps)
