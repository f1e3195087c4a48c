"""The demo's dashboard: act 2's control plane served over HTTP while it runs (and, with
``gpufence demo --keep``, after it until Ctrl-C), so the surge can be watched live at ``/``.

The demo drives its planes in-process; this serves the same FastAPI app as ``gpufence up``
(``make_app``) from a background thread on 127.0.0.1 and a free port. Sign-in is the admin
token of the act's data directory (its path is printed, never the token itself).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Generator
from pathlib import Path

import uvicorn

from gpufence.control.base.config import TOKEN_FILE
from gpufence.control.http.api import make_app
from gpufence.control.plane import ControlPlane


class _Quiet(uvicorn.Server):
    """A uvicorn server for a non-main thread: the demo's own Ctrl-C handling stays in charge."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class Dashboard:
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(256)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/"
        config = uvicorn.Config(
            make_app(plane), lifespan="off", log_level="warning", timeout_graceful_shutdown=2
        )
        self._server = _Quiet(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="demo-dashboard"
        )
        self._thread.daemon = True

    @property
    def token_file(self) -> Path:
        return self.plane.data_dir / TOKEN_FILE

    def start(self) -> Dashboard:
        self._thread.start()
        return self

    def sign_in_hint(self) -> str:
        return f"sign in with the admin token in {self.token_file}"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()
