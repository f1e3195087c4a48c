"""``gpufence up``: build the control plane and serve its HTTP API with uvicorn.

``build_plane`` opens the store, which locks the database file itself (two control planes on one
store would run every job twice; see ``store/ownership.py``) and checks its integrity.
``serve`` runs in the calling thread. It binds the socket itself (port 0 picks a free one),
starts the plane (recovery, then the reconciler), and once uvicorn listens writes
``DATA/server.json`` = ``{"url", "pid"}`` for the CLI. SIGINT / SIGTERM stop it gracefully:
the API closes, the reconciler stops, ``server.json`` is removed, and running jobs keep running:
the next ``gpufence up`` on the same data directory adopts them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Generator
from pathlib import Path
from types import FrameType

import uvicorn

from gpufence.advice.inputs import LintInputs
from gpufence.control.base.config import (
    SERVER_FILE,
    TOKEN_FILE,
    ControlConfig,
    cluster_from_spec_dict,
    control_config,
    load_config,
)
from gpufence.control.base.datadir import DataDirError, check_data_dir
from gpufence.control.base.privatefs import write_private
from gpufence.control.containment.cgroup import ContainmentError
from gpufence.control.containment.members import Containment
from gpufence.control.gpus.devnodes import all_nodes, with_fake_nodes
from gpufence.control.gpus.discovery import (
    Discovery,
    DiscoveryError,
    discover,
    fake_gpus,
    node_spec,
)
from gpufence.control.gpus.nodespec import host_resources
from gpufence.control.http.api import make_app
from gpufence.control.http.slow_clients import Caps, http_protocol, raise_file_limit
from gpufence.control.plane import ControlPlane
from gpufence.control.store.errors import StoreError, StoreUnavailable
from gpufence.model.cluster import Cluster
from gpufence.spec import load_cluster_with_sections
from gpufence.spec.positions import queue_positions

log = logging.getLogger("gpufence.server")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7878


class StartupError(ValueError):
    """The control plane cannot start; the message says what to do (the CLI exits 2)."""


def build_plane(
    config: Path | None,
    data_dir: Path,
    fake_gpus_n: int | None = None,
    fake_gpu_type: str = "H100-80GB",
    executor: str = "local",
    ray_address: str | None = None,
    check_integrity: bool = True,
    no_containment: bool = False,
) -> ControlPlane:
    """The control plane for ``gpufence up`` (not started: ``serve`` starts it).

    GPUs: ``fake_gpus_n`` made-up ones, else this machine's (NVML). Cluster: the ``--config``
    spec (with its ``control:`` section), else this machine as one node, one partition.
    ``executor="ray"``: the nodes of the Ray cluster at ``ray_address`` (see ``ray_plane``).
    Containment (every member in its own cgroup) is detected here; a machine without it is
    refused (StartupError saying how to fix it) unless ``no_containment``, which is logged loudly.
    ``check_integrity=False`` (``--skip-integrity-check``) opens a store without
    ``PRAGMA quick_check``.
    """
    if executor == "ray":
        if fake_gpus_n:
            raise StartupError(
                "--fake-gpus is for the local executor; Ray nodes declare their GPUs "
                "(ray start --num-gpus N)"
            )
        return _ray_plane(config, data_dir, ray_address, check_integrity, no_containment)
    if executor != "local":
        raise StartupError(f"--executor must be local or ray, not {executor!r}")
    try:  # before anything is made in it (the token file, its modes): issue 30, case 8
        check_data_dir(data_dir)
    except DataDirError as exc:
        raise StartupError(str(exc)) from None
    discovery = _discovery(fake_gpus_n, fake_gpu_type)
    cluster, cc = _cluster(config, data_dir, discovery)
    discovery = with_fake_nodes(discovery, cc.containment.fake_gpu_devices)
    containment = _containment(cc, discovery, no_containment)
    try:
        try:
            plane = ControlPlane(
                cluster,
                cc,
                discovery,
                data_dir,
                containment=containment,
                check_integrity=check_integrity,
            )
        except BaseException:
            if containment is not None:  # its parent cgroup, made by detect
                containment.release()
            raise
    except StoreError as exc:
        raise StartupError(_store_problem(exc, data_dir)) from None
    except StoreUnavailable as exc:
        raise StartupError(f"cannot open the store in {data_dir}: {exc.reason}") from None
    except RuntimeError as exc:  # DeviceError: the spec does not describe this machine
        raise StartupError(str(exc)) from None
    if config is not None:  # advice names the file's lines and queue positions
        lines = load_cluster_with_sections(config, ("control",))[2]
        plane.advice_inputs = LintInputs(queue_index=queue_positions(config), lines=lines)
        plane.advice_source = str(config)
    return plane


def _discovery(fake_gpus_n: int | None, fake_gpu_type: str) -> Discovery:
    """``fake_gpus_n`` made-up GPUs, else this machine's (NVML)."""
    try:
        return fake_gpus(fake_gpus_n, fake_gpu_type) if fake_gpus_n else discover()
    except DiscoveryError as exc:
        if fake_gpus_n:
            raise StartupError(str(exc)) from None
        raise StartupError(f"no NVIDIA GPU/driver found: use --fake-gpus N\n  ({exc})") from None


def _cluster(
    config: Path | None, data_dir: Path, discovery: Discovery
) -> tuple[Cluster, ControlConfig]:
    """The ``--config`` spec with its ``control:`` section, else this machine as one node."""
    if config is not None:
        # the local executor runs everything here: a node group that leaves out cpu_cores or
        # memory_gib gets this machine's, so --cpus / --mem are placed against real capacity
        return load_config(config, data_dir, host_resources())
    try:
        spec = node_spec(discovery)
    except DiscoveryError as exc:
        raise StartupError(str(exc)) from None
    return cluster_from_spec_dict(spec), control_config(None, data_dir)


def _ray_plane(
    config: Path | None,
    data_dir: Path,
    ray_address: str | None,
    check_integrity: bool,
    no_containment: bool,
) -> ControlPlane:
    """``build_plane`` for ``--executor ray`` (imported only then: Ray is an optional extra)."""
    from gpufence.control.plane.ray_plane import RayStartError, ray_plane

    try:
        return ray_plane(config, data_dir, ray_address, check_integrity, contain=not no_containment)
    except RayStartError as exc:
        raise StartupError(str(exc)) from None
    except StoreError as exc:
        raise StartupError(_store_problem(exc, data_dir)) from None


def _containment(cc: ControlConfig, discovery: Discovery, off: bool) -> Containment | None:
    if off:
        log.warning(NO_CONTAINMENT_WARNING)
        return None
    try:
        return Containment.detect(cc.containment, all_nodes(discovery))
    except ContainmentError as exc:
        raise StartupError(str(exc)) from None


NO_CONTAINMENT_WARNING = (
    "CONTAINMENT IS OFF (--no-containment): jobs run in no cgroup, with no CPU, memory or pids "
    "limit and no device isolation (a job can open every GPU), and processes a job leaves "
    "behind keep running (and keep using its GPUs) after it ends"
)


def _store_problem(exc: StoreError, data_dir: Path) -> str:
    text = str(exc)
    if "another gpufence control plane" in text:
        other = read_server_file(data_dir)
        if other:
            text += f" (it serves {other.get('url')}, pid {other.get('pid')})"
    return text


def listen_on(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto given explicitly: asyncio sets TCP_NODELAY on accepted sockets only when their
    # proto says TCP; without it every response waited ~40 ms for the client's delayed ACK
    # (uvicorn writes the head and the body of a response separately: Nagle held the body)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        hint = " (another gpufence up? pick one with --port)" if port else ""
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror}{hint}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _client_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def read_server_file(data_dir: Path) -> dict[str, object] | None:
    try:
        data = json.loads((data_dir / SERVER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_server_file(data_dir: Path, url: str) -> Path:
    path = data_dir / SERVER_FILE
    write_private(path, json.dumps({"url": url, "pid": os.getpid()}) + "\n")
    return path


class _Server(uvicorn.Server):
    """uvicorn.Server that announces itself once listening, stops on an event, and handles
    SIGINT/SIGTERM without re-raising them afterwards (uvicorn's default), so ``serve`` can
    close the plane and clean up before returning."""

    def __init__(
        self,
        config: uvicorn.Config,
        on_started: Callable[[], None],
        stop: threading.Event | None,
    ) -> None:
        super().__init__(config)
        self._on_started = on_started
        self._stop_event = stop

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self._on_started()

    async def on_tick(self, counter: int) -> bool:
        if self._stop_event is not None and self._stop_event.is_set():
            self.should_exit = True
        return await super().on_tick(counter)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handle(sig: int, _frame: FrameType | None) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop waiting for open connections
            self.should_exit = True
            log.info("%s: shutting down", signal.Signals(sig).name)

        original = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in original.items():
                signal.signal(s, h)


def serve(
    plane: ControlPlane,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    ready: threading.Event | None = None,
    stop: threading.Event | None = None,
    kill_jobs: bool = False,
    log_level: str = "info",
    listening: socket.socket | None = None,
) -> None:
    """Serve ``plane`` over HTTP until SIGINT/SIGTERM (main thread) or ``stop`` is set.

    ``ready`` is set once the server accepts connections and ``DATA/server.json`` is written.
    On the way out the plane is closed; running jobs keep running unless ``kill_jobs``.
    ``listening``: a socket already bound (``listen_on``, before the plane was built: a port in
    use then stops ``gpufence up`` before it makes a data directory); else ``host:port`` now.
    """
    data_dir = plane.data_dir
    # idle clients must not starve the plane of descriptors (issue 30, case 6): the soft limit
    # up to the hard one, and connections capped well below it (slow_clients.Caps)
    caps = Caps.for_limit(raise_file_limit())
    with contextlib.ExitStack() as stack:
        try:
            sock = stack.enter_context(listening or listen_on(host, port))
        except BaseException:
            plane.close(kill_jobs=False)  # never started: nothing of it runs yet
            raise
        url = f"http://{_client_host(host)}:{sock.getsockname()[1]}"
        server_file: list[Path] = []

        def announce() -> None:
            server_file.append(_write_server_file(data_dir, url))
            log.info("gpufence control plane listening on %s (data: %s)", url, data_dir)
            if (data_dir / TOKEN_FILE).exists():  # the path, never the token itself
                log.info("admin token: %s (the CLI reads it from there)", data_dir / TOKEN_FILE)
            if ready is not None:
                ready.set()

        started = False
        try:
            try:
                plane.start()
            except StoreError as exc:  # recovery's refusals (store.strangers): one line, exit 2
                raise StartupError(str(exc)) from None
            started = True
            if plane.recovered.get("adopted"):
                log.info("adopted %d running jobs from the last run", plane.recovered["adopted"])
            config = uvicorn.Config(
                make_app(plane),
                # uvloop and httptools where installed (the server extra installs both):
                # their C loop and parser are most of a submit's budget in pure Python
                loop="auto",
                http=http_protocol(caps),  # uvicorn's, closing slow-loris, capped
                lifespan="off",
                # nothing here reads a client's address, and X-Forwarded-For from any local
                # process would only spoof the one uvicorn logs: its middleware is skipped
                proxy_headers=False,
                log_level=log_level,
                timeout_graceful_shutdown=5,
            )
            _Server(config, announce, stop).run(sockets=[sock])
        finally:
            for path in server_file:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            running = len(plane.reconciler.live) if started else 0
            plane.close(kill_jobs=kill_jobs)
            if kill_jobs and running:
                log.info("control plane stopped; its %d running job(s) were stopped", running)
            elif running:
                log.info(
                    "control plane stopped; %d running job(s) keep running and are adopted by "
                    "the next `gpufence up --data %s`",
                    running,
                    data_dir,
                )
            else:
                log.info("control plane stopped")
