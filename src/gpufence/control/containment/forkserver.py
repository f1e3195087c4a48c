"""A pre-started launcher: a small process that forks one launcher per gang member.

Starting a member used to cost a fresh ``python -I -S launcher.py`` (~20-25 ms of interpreter
start-up, most of a GPU hand-off). The fork server is that interpreter, started once by the
executor with the launcher already imported; for each member it ``fork``s (~1 ms), and the child
becomes the launcher: its own process group, stdin/stdout on ``/dev/null``, stderr on
``rank-R.err``, then ``launcher.main`` with the member's argv and environment (whose child joins
the member's cgroup, switches user and execs the job).

Protocol (one ``socketpair``, length-prefixed JSON, one request at a time):

* ``{"op": "spawn", "argv", "env", "err", "pid_file"}`` -> ``{"pid"}`` or ``{"error"}``;
  the server writes the launcher's pid record before answering, so a crash right after the
  spawn still leaves one;
* ``{"op": "reap", "pid"}`` -> ``{"code"}``: the launcher's exit code (None: still running or
  not ours); the executor asks only when the launcher left no exit record. The server reaps its
  exited launchers itself, ``ZOMBIE_HOLD_S`` after they exit: until then the zombie keeps the
  pid, and so the process-group id, from being reused while the executor kills what is left of
  the group;
* ``{"op": "arm", "join"}`` -> ``{"pid", "start"}`` plus a descriptor: a pre-started member
  (``prestart.py``) whose job child joins the cgroup directories ``join`` now; the executor
  starts a job in it later by writing to that descriptor (``ForkServer.activate``), without a
  round trip through the server.

Restarts: the launchers are independent processes in their own sessions. When the executor
goes (``gpufence up`` stopped or killed), the server sees EOF and exits; its launchers, running
or not yet reaped, are re-parented to init, which reaps them, and the jobs run on. The next
control plane starts a new server and adopts the jobs from their records, as it always did: no
exit code depends on the server that forked the launcher (the launcher writes ``rank-R.exit``).

This module runs in the server process with the standard library and the launcher only.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufence.control.base import launcher, member_records
from gpufence.control.containment import prestart

_HEADER = struct.Struct(">I")
_BLOCKED = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP}
"""Blocked in the server, so a forked launcher starts with them blocked (it forwards them)."""
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from gpufence.control.containment.forkserver import serve; serve(int(sys.argv[2]))"
)
_SRC = str(Path(launcher.__file__).resolve().parents[3])  # the directory holding gpufence/


class ForkServerError(RuntimeError):
    """The fork server could not start or answer."""


def _send(sock: socket.socket, msg: dict[str, Any]) -> None:
    data = json.dumps(msg).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket) -> dict[str, Any] | None:
    head = _recv_exact(sock, _HEADER.size)
    if head is None:
        return None
    body = _recv_exact(sock, _HEADER.unpack(head)[0])
    if body is None:
        return None
    msg = json.loads(body)
    return msg if isinstance(msg, dict) else None


# ---------------------------------------------------------------------- server side
ZOMBIE_HOLD_S = 2.0
_KEEP_CODES = 4096


class _Children:
    """The launchers this server forked: reaped ``ZOMBIE_HOLD_S`` after they exit, their exit
    codes kept (the last ``_KEEP_CODES``) for the executor's ``reap``."""

    def __init__(self) -> None:
        self.exited_at: dict[int, float | None] = {}
        self.codes: dict[int, int] = {}

    def add(self, pid: int) -> None:
        self.exited_at[pid] = None

    def collect(self, now: float) -> None:
        for pid, seen in list(self.exited_at.items()):
            try:
                res = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                del self.exited_at[pid]
                continue
            if res is None:
                continue
            if seen is None:
                self.exited_at[pid] = now
            elif now - seen >= ZOMBIE_HOLD_S:
                self.reap(pid)

    def reap(self, pid: int) -> int | None:
        if pid in self.codes:
            return self.codes.pop(pid)
        code = _reap(pid)
        if code is not None:
            self.exited_at.pop(pid, None)
            self.codes[pid] = code
            while len(self.codes) > _KEEP_CODES:
                del self.codes[next(iter(self.codes))]
        return code


def serve(fd: int) -> None:
    """The server loop (in its own process): until the executor's end of ``fd`` closes."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
    sock = socket.socket(fileno=fd)
    _send(sock, {"ready": os.getpid()})
    children = _Children()
    while True:
        if not select.select([sock], [], [], ZOMBIE_HOLD_S / 2)[0]:
            children.collect(time.monotonic())
            continue
        msg = _recv(sock)
        if msg is None:
            return
        op = msg.get("op")
        if op == "spawn":
            reply = _spawn(sock, msg)
            if "pid" in reply:
                children.add(int(reply["pid"]))
        elif op == "reap":
            code = children.reap(int(msg["pid"]))
            reply = {"code": code}
        elif op == "arm":
            pid = _arm(sock, [str(d) for d in msg["join"]])
            if pid is not None:
                children.add(pid)
            children.collect(time.monotonic())
            continue  # answered with the descriptor
        else:
            reply = {"error": f"unknown request {op!r}"}
        _send(sock, reply)
        children.collect(time.monotonic())


def _arm(sock: socket.socket, join_dirs: list[str]) -> int | None:
    """Fork a pre-started member; the executor gets the write ends of its two pipes."""
    (lr, lw), (cr, cw) = os.pipe(), os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in (lr, lw, cr, cw):
            os.close(fd)
        _send(sock, {"error": f"fork failed: {exc.strerror}"})
        return None
    if pid == 0:  # pragma: no cover - the pre-started launcher
        os.close(lw)
        os.close(cw)
        os.close(sock.detach())
        prestart.run_launcher(lr, cr, join_dirs)
    os.close(lr)
    os.close(cr)
    _own_group(pid)
    try:
        data = json.dumps({"pid": pid, "start": member_records.proc_start_time(pid)}).encode()
        socket.send_fds(sock, [_HEADER.pack(len(data)) + data], [lw, cw])
    finally:
        os.close(lw)
        os.close(cw)
    return pid


def _spawn(sock: socket.socket, msg: dict[str, Any]) -> dict[str, Any]:
    try:
        err = member_records.open_log(msg["err"])  # in the job's directory: no link followed
    except OSError as exc:
        return {"error": f"cannot open {msg['err']}: {exc.strerror or exc}"}
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(err)
        return {"error": f"fork failed: {exc.strerror}"}
    if pid == 0:  # pragma: no cover - the launcher; ends in os._exit
        code = launcher.EXIT_NOT_EXECUTABLE
        try:
            os.close(sock.detach())
            os.setpgid(0, 0)  # (the parent does it too: whoever is first)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.dup2(err, 2)
            code = launcher.main([str(a) for a in msg["argv"]], dict(msg["env"]))
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.write(2, f"gpufence launcher: {exc!r}\n".encode())
        finally:
            os._exit(code & 0xFF)
    os.close(err)
    _own_group(pid)
    start = member_records.proc_start_time(pid)
    if start is not None and msg.get("pid_file"):
        with contextlib.suppress(OSError):
            member_records.atomic_write(
                Path(msg["pid_file"]), member_records.pid_record(pid, start)
            )
    return {"pid": pid}


def _own_group(pid: int) -> None:
    """Make the new launcher the leader of its own process group before the executor hears of
    it: a stop sent right after the spawn must find the group (the child does the same, so the
    order does not matter; the server's session has no terminal, so no new session is needed)."""
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)


def _reap(pid: int) -> int | None:
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if got == pid else None


# ---------------------------------------------------------------------- executor side
@dataclass(eq=False)
class Spare:
    """A pre-started member (``arm``), ready to be given a job (``activate``)."""

    pid: int
    """Its launcher."""
    start_time: int
    fd: int
    """Write end of the launcher's activation pipe (closing it unused makes it exit)."""
    child_fd: int
    """Write end of the job child's command pipe."""
    generation: int


class ForkServer:
    """The executor's handle on its fork server; thread-safe (one request at a time)."""

    def __init__(self, python: str = sys.executable) -> None:
        self._python = python
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self.generation = 0
        """Bumped at each (re)start: launchers of an earlier server are no longer its children."""
        with self._lock:
            self._start_locked()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start_locked(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen(
                [self._python, "-I", "-S", "-c", _BOOT, _SRC, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                # its launchers read the spool and failpoint variables for themselves
                env={"PATH": os.environ.get("PATH", os.defpath), **member_records.launcher_env()},
                # its launchers stay here; each job enters its own directory as its own user
                cwd="/",
                start_new_session=True,  # Ctrl-C on `gpufence up` does not reach it
            )
        except OSError as exc:
            ours.close()
            raise ForkServerError(f"cannot start the fork server: {exc}") from exc
        finally:
            theirs.close()
        self._sock = ours
        hello = _recv(ours)
        if hello is None or "ready" not in hello:
            self._stop_locked()
            raise ForkServerError("the fork server exited at start-up (see the server log)")
        self.generation += 1

    def _stop_locked(self) -> None:
        if self._sock is not None:
            self._sock.close()  # EOF: the server exits; its launchers run on
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def _call_locked(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self._sock is None:
            raise ForkServerError("the fork server is closed")
        try:
            _send(self._sock, msg)
            reply = _recv(self._sock)
        except OSError as exc:
            raise ForkServerError(f"the fork server did not answer: {exc}") from exc
        if reply is None:
            raise ForkServerError("the fork server exited")
        return reply

    def spawn(
        self, argv: list[str], env: dict[str, str], err: Path, pid_file: Path
    ) -> tuple[int, int]:
        """Fork a launcher (the job's working directory is its ``--cwd``); ``(pid,
        generation)``. A dead server is restarted once."""
        msg = {
            "op": "spawn",
            "argv": argv,
            "env": env,
            "err": str(err),
            "pid_file": str(pid_file),
        }
        with self._lock:
            try:
                reply = self._call_locked(msg)
            except ForkServerError:
                self._stop_locked()
                self._start_locked()
                reply = self._call_locked(msg)
            if "error" in reply:
                raise ForkServerError(str(reply["error"]))
            return int(reply["pid"]), self.generation

    def arm(self, join_dirs: tuple[str, ...]) -> Spare:
        """A pre-started member whose job child joins ``join_dirs`` (in the background)."""
        with self._lock:
            if self._sock is None:
                raise ForkServerError("the fork server is closed")
            try:
                _send(self._sock, {"op": "arm", "join": list(join_dirs)})
                head, fds, _f, _a = socket.recv_fds(self._sock, _HEADER.size, 2)
                body = _recv_exact(self._sock, _HEADER.unpack(head)[0]) if head else None
            except (OSError, struct.error) as exc:
                raise ForkServerError(f"the fork server did not answer: {exc}") from exc
            reply = json.loads(body) if body else None
            if not isinstance(reply, dict) or "pid" not in reply or len(fds) != 2:
                for fd in fds:
                    os.close(fd)
                why = reply.get("error") if isinstance(reply, dict) else "no answer"
                raise ForkServerError(f"cannot pre-start a member: {why}")
            start = int(reply["start"] or 0)
            return Spare(int(reply["pid"]), start, fds[0], fds[1], self.generation)

    @staticmethod
    def activate(
        spare: Spare,
        argv: list[str],
        env: dict[str, str],
        logs: tuple[Path, Path],
        child: dict[str, Any],
    ) -> int:
        """Start a job in a pre-started member: the launcher gets its arguments, the job child
        its command and ``child`` (``command``, ``uid``, ``gid``, ``groups``, ``cwd``), both at
        once. The launcher's pid."""
        out, err = logs
        to_launcher = {"argv": argv, "env": env, "err": str(err)}
        # a capped log is written through a pipe the launcher pumps (logcap.py)
        pipe = launcher.log_limit_of(argv) is not None
        to_child = {**child, "env": env, "out": str(out), "err": str(err), "pipe": pipe}
        try:  # the launcher first: a child told to run must have its launcher running
            for fd, msg in ((spare.fd, to_launcher), (spare.child_fd, to_child)):
                data = memoryview(prestart.frame(msg))
                while data:
                    data = data[os.write(fd, data) :]
        except OSError as exc:
            raise ForkServerError(f"the pre-started member is gone: {exc}") from exc
        finally:
            ForkServer.discard(spare)
        return spare.pid

    @staticmethod
    def discard(spare: Spare) -> None:
        """Let a pre-started member go unused: it kills its child and exits."""
        for fd in (spare.fd, spare.child_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        spare.fd = spare.child_fd = -1

    def reap(self, pid: int, generation: int) -> int | None:
        """The exit code of an exited launcher this server forked (None: unknown)."""
        with self._lock:
            if generation != self.generation or self._sock is None:
                return None
            try:
                code = self._call_locked({"op": "reap", "pid": pid}).get("code")
            except ForkServerError:
                return None
            return code if isinstance(code, int) else None

    def close(self) -> None:
        with self._lock:
            self._stop_locked()
