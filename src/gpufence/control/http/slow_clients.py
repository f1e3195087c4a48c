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
"""

from __future__ import annotations

import asyncio
from typing import Any

HEAD_TIMEOUT_S = 30.0
"""How long a connection may go without a complete request (its head) being in flight."""
CHECK_S = 5.0


def guarded(protocol: type[Any]) -> type[Any]:
    """``protocol`` (a uvicorn HTTP protocol class) that closes slow-loris connections."""

    class Guarded(protocol):  # type: ignore[misc]
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._idle_since = self._began = self.loop.time()
            self._seen_cycle: Any = None
            self._guard = self.loop.call_later(CHECK_S, self._check)

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

        def connection_lost(self, exc: Exception | None) -> None:
            self._guard.cancel()
            super().connection_lost(exc)

    Guarded.__name__ = f"Guarded{protocol.__name__}"
    return Guarded


def http_protocol() -> type[Any]:
    """The protocol class uvicorn's ``http="auto"`` would pick, guarded."""
    try:
        import httptools  # noqa: F401  (what "auto" checks)
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return guarded(HttpToolsProtocol)
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return guarded(H11Protocol)
