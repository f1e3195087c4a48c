"""The terminal of a pty job (``gpufence run --pty``): runs its command on a pseudo-terminal and
serves that terminal on a Unix socket, for the server to relay to the user's WebSocket.

The host is the launcher's child for a pty job (``launcher.py --pty-grace``; in a pre-started
member, its child ``C``), forked without an exec: it runs as the control plane's user (root on a
multi-tenant server), so it needs nothing the job's user may read (a server's interpreter under
``/root`` is not), and the job, another uid, can neither signal nor trace it. ``host_job``

1. joins the member's cgroups (no process of the job ever runs outside them; the host's CPU and
   memory are the job's), binds the socket (``member_records.pty_socket``: mode 0600 in the
   control plane's 0700 records directory, so no tenant, the job's own user included, can
   connect to it or replace it), and forks the command on a new pseudo-terminal: the child
   becomes the leader of a new session with the terminal as its controlling one and its
   stdin/stdout/stderr, then ``launcher.exec_child`` switches it to the job's groups, gid and
   uid, enters its working directory as that user and execs it. The launcher learns of the
   exec (or why it failed: the same 127/126/125 as any command) through its report pipe, then
   records the host's exit as the job's;
2. copies the output to stdout (the job's ``rank-0.out``: ``gpufence logs`` shows the session)
   and keeps a scrollback of ``SCROLLBACK`` bytes that a client gets first when it connects;
3. serves the socket with ``ptyframes``: every connected client gets the output, and its input
   and window size go to the terminal; several clients (``gpufence attach``) share it;
4. ends the session when nobody has been connected for the grace (the client's machine went
   away): a line on stderr says so, the terminal's session gets SIGHUP (as a closed ssh does),
   SIGKILL ``KILL_AFTER_S`` later; the job ends with 129, the shell's hangup;
5. passes a stop on: SIGTERM / SIGINT / SIGHUP reach the launcher's group, not the terminal's
   session, so the host sends SIGHUP and SIGTERM to that session (an interactive shell ignores
   SIGTERM); other caught signals (the notice) are forwarded as they are;
6. tells the clients (not the command) of a notice: the idle warning of the interactive fence,
   a time limit, a preemption, as the job's notice file says (``NoticeWatch``: read without
   following a link the job may have put in its place);
7. exits with the command's code (128 + N for signal N), after sending it to every client.

Standard library only: the launcher imports it (by path with ``python -I -S`` on a Ray node).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import select
import signal
import socket
import stat
import struct
import termios
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

from gpufence.control.base.ptyframes import (
    DATA,
    EXIT,
    RESIZE,
    FrameError,
    FrameReader,
    frame,
    parse_resize,
)

SCROLLBACK = 64 * 1024
KILL_AFTER_S = 5.0
MAX_CLIENT_BACKLOG = 4 << 20
"""Output queued for one client beyond this drops the client (it reads slower than the job
writes): the terminal never waits for a client."""
HANGUP_EXIT = 128 + signal.SIGHUP
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


NOTICE_POLL_S = 1.0
NOTICE_MAX = 64 * 1024
NOTICES = {
    "idle": "this session has been idle: its GPUs are reclaimed {when} unless it is used again",
    "time-limit": "this session reaches its time limit: it is stopped {when}",
}


class NoticeWatch:
    """The job's notice file (``$GPUFENCE_NOTICE_FILE``: an idle warning, a time limit, a
    preemption), told to the people at the terminal: the shell itself never reads it."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.seen: tuple[int, int] | None = None

    def check(self) -> str | None:
        """A line for the terminal when the notice is new or changed; None otherwise."""
        if not self.path:
            return None
        try:
            notice = self._read()
            if notice is None:
                return None
            reason, deadline = str(notice["reason"]), float(notice["deadline_unix"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        when = f"in {max(0, round(deadline - time.time()))} s"
        known = NOTICES.get(reason)  # the file is the job's to write: its text is no format
        text = (
            known.format(when=when)
            if known
            else f"notice ({reason}): this session is stopped {when}"
        )
        return f"\r\n[gpufence: {text}]\r\n"

    def _read(self) -> dict[str, Any] | None:
        """The notice when new or changed. The host reads it as the control plane's user
        from the job's own directory: never through a link (the job could point one at a file
        it may not read), a regular file with one link only, at most ``NOTICE_MAX`` bytes."""
        assert self.path is not None
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(self.path, flags)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                return None
            key = (st.st_ino, st.st_mtime_ns)
            if key == self.seen:
                return None
            self.seen = key
            notice = json.loads(os.read(fd, NOTICE_MAX))
        finally:
            os.close(fd)
        return notice if isinstance(notice, dict) else None


class Client:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = FrameReader()
        self.out = bytearray()


class Host:
    """The terminal, its clients and the grace clock (``serve`` is the loop)."""

    def __init__(
        self,
        child: int,
        master: int,
        listener: socket.socket,
        grace_s: float,
        notice_file: str | None,
    ) -> None:
        self.child = child
        self.master = master
        self.listener = listener
        self.grace_s = grace_s
        self.clients: dict[int, Client] = {}
        self.scrollback = bytearray()
        self.to_tty = bytearray()
        self.alone_since: float | None = time.monotonic()
        self.kill_at: float | None = None
        self.pidfd = os.pidfd_open(child)
        self.tty_open = True
        self.notices = NoticeWatch(notice_file)

    # -------------------------------------------------------------- the loop
    def serve(self) -> int:
        """Relay until the command has exited; its exit code."""
        while True:
            readers = [self.pidfd, self.listener.fileno()]
            readers += [c.sock.fileno() for c in self.clients.values()]
            writers = [c.sock.fileno() for c in self.clients.values() if c.out]
            if self.tty_open:
                readers.append(self.master)
                if self.to_tty:
                    writers.append(self.master)
            ready_r, ready_w, _ = select.select(readers, writers, [], self._timeout())
            if self.pidfd in ready_r:
                return self._finish()
            self._handle(ready_r, ready_w)
            self._check_grace()
            line = self.notices.check()
            if line is not None:
                self._tell(line.encode())

    def _handle(self, ready_r: list[int], ready_w: list[int]) -> None:
        if self.master in ready_r:
            self._read_tty()
        if self.master in ready_w:
            self._write_tty()
        if self.listener.fileno() in ready_r:
            self._accept()
        for fd, c in list(self.clients.items()):
            if fd in ready_r:
                self._read_client(c)
            if fd in ready_w and fd in self.clients:
                self._write_client(c)

    def _timeout(self) -> float | None:
        deadlines = [t for t in (self._grace_end(), self.kill_at) if t is not None]
        wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        if self.notices.path:
            wait = NOTICE_POLL_S if wait is None else min(wait, NOTICE_POLL_S)
        return wait

    def _grace_end(self) -> float | None:
        if self.alone_since is None or self.kill_at is not None:
            return None
        return self.alone_since + self.grace_s

    def _check_grace(self) -> None:
        now = time.monotonic()
        end = self._grace_end()
        if end is not None and now >= end:
            msg = (
                f"gpufence: no terminal attached for {self.grace_s:g} s (the client went away): "
                "the session is hung up\n"
            )
            with contextlib.suppress(OSError):
                os.write(2, msg.encode())
            self.hangup()
        elif self.kill_at is not None and now >= self.kill_at:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.child, signal.SIGKILL)
            self.kill_at = None

    def hangup(self) -> None:
        """SIGHUP + SIGCONT to the terminal's session (SIGTERM too: a non-shell command may
        ignore the hangup), SIGKILL after ``KILL_AFTER_S``."""
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGCONT):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.child, sig)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + KILL_AFTER_S
        self.alone_since = None

    # -------------------------------------------------------------- the terminal
    def _read_tty(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except OSError as exc:  # EIO: no process has the terminal open any more
            if exc.errno not in (errno.EAGAIN, errno.EINTR):
                self.tty_open = False
            return
        if not data:
            self.tty_open = False
            return
        self._output(data)

    def _output(self, data: bytes) -> None:
        with contextlib.suppress(OSError):  # a full disk must not stop the session
            os.write(1, data)
        self._tell(data)

    def _tell(self, data: bytes) -> None:
        """To every client, and to the scrollback a client gets when it comes."""
        self.scrollback += data
        del self.scrollback[:-SCROLLBACK]
        out = frame(DATA, data)
        for c in list(self.clients.values()):
            c.out += out
            if len(c.out) > MAX_CLIENT_BACKLOG:
                self._drop(c)

    def _write_tty(self) -> None:
        try:
            n = os.write(self.master, self.to_tty)
        except BlockingIOError:
            return
        except OSError:
            self.to_tty.clear()
            return
        del self.to_tty[:n]

    # -------------------------------------------------------------- clients
    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        sock.setblocking(False)
        c = Client(sock)
        self.clients[sock.fileno()] = c
        self.alone_since = None
        if self.scrollback:
            c.out += frame(DATA, bytes(self.scrollback))

    def _read_client(self, c: Client) -> None:
        try:
            data = c.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(c)
            return
        try:
            frames = c.reader.feed(data)
            for kind, payload in frames:
                if kind == DATA:
                    self.to_tty += payload
                elif kind == RESIZE:
                    rows, cols = parse_resize(payload)
                    winsize = struct.pack("HHHH", rows, cols, 0, 0)
                    fcntl.ioctl(self.master, termios.TIOCSWINSZ, winsize)  # the kernel: SIGWINCH
        except (FrameError, OSError):
            self._drop(c)

    def _write_client(self, c: Client) -> None:
        try:
            n = c.sock.send(c.out)
        except BlockingIOError:
            return
        except OSError:
            self._drop(c)
            return
        del c.out[:n]

    def _drop(self, c: Client) -> None:
        self.clients.pop(c.sock.fileno(), None)
        c.sock.close()
        if not self.clients and self.kill_at is None:
            self.alone_since = time.monotonic()

    # -------------------------------------------------------------- the end
    def _finish(self) -> int:
        """The command exited: the rest of its output, its code to every client, the code."""
        _, status = os.waitpid(self.child, 0)
        code = os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code
        end = time.monotonic() + 0.5  # what it wrote last (a child may still hold the tty)
        while self.tty_open and time.monotonic() < end:
            if not select.select([self.master], [], [], 0.05)[0]:
                break
            self._read_tty()
        line = self.notices.check()  # one that came just before the end: why it ended
        if line is not None:
            self._tell(line.encode())
        for c in list(self.clients.values()):
            c.out += frame(EXIT, str(code).encode())
            c.sock.setblocking(True)
            c.sock.settimeout(2.0)
            with contextlib.suppress(OSError):
                c.sock.sendall(c.out)
            c.sock.close()
        self.clients.clear()
        return code


def listen(path: str) -> socket.socket:
    """A 0600 Unix socket at ``path``, bound through the directory's descriptor: an attempt
    directory's path can be longer than a socket address (108 bytes)."""
    directory, name = os.path.split(path)
    dfd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dfd)  # an earlier host's, of this attempt
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(f"/proc/self/fd/{dfd}/{name}")
        finally:
            os.umask(old)
    finally:
        os.close(dfd)
    sock.listen(8)
    sock.setblocking(False)
    return sock


class Confinement(Protocol):
    """What the host needs of ``launcher.Confine`` (imported by the launcher: not imported
    back)."""

    cgroups: list[str]
    terminal: tuple[str, float] | None

    def join_cgroups(self) -> None: ...


ExecChild = Callable[[list[str], dict[str, str], int, int, Any, int], None]
"""``launcher.exec_child``: in a forked child, confine and exec the command (or report why
not on the last argument, a close-on-exec pipe)."""


def host_job(
    command: list[str],
    env: dict[str, str],
    confine: Confinement,
    report: int,
    exec_child: ExecChild,
) -> NoReturn:  # pragma: no cover - the launcher's child: ends in _exit
    """Be the terminal host of ``command`` (see the module docstring); ``report`` is the
    launcher's pipe: closed once the command has exec'd, else why it did not. Exits with the
    command's code."""
    assert confine.terminal is not None
    path, grace_s = confine.terminal
    confine.join_cgroups()  # before anything of the job exists (SpawnFailure: not contained)
    listener = listen(path)
    try:
        child, master = _spawn(command, env, confine, exec_child)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(path)
        if isinstance(exc, NotStarted):  # the launcher records it as for any command
            os.write(report, exc.why)
            os._exit(127)
        raise
    os.close(report)  # the launcher's spawn returns: the command runs
    code = 125
    try:
        code = _serve(Host(child, master, listener, grace_s, env.get("GPUFENCE_NOTICE_FILE")))
    except BaseException:  # a bug here must not leave the session without its host's end
        with contextlib.suppress(OSError):
            os.write(2, f"gpufence ptyhost: {traceback.format_exc()}".encode())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, 0)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    os._exit(code & 0xFF)


def _serve(host: Host) -> int:
    """The host's signals, then its loop: the command's exit code."""

    def forward(signum: int, _frame: object) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            host.hangup()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(host.child, signum)

    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a client gone: EPIPE, not death
    for sig in FORWARDED:
        signal.signal(sig, forward)
    # the launcher forked us with its caught signals blocked: one that came meanwhile (a stop
    # before the command ran) is handled now, by ``forward``
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    return host.serve()


class NotStarted(Exception):
    """The command could not be executed (not found, not executable, not contained)."""

    def __init__(self, why: bytes) -> None:
        super().__init__(why.decode(errors="replace"))
        self.why = why
        """As ``exec_child`` reports it (``launcher.await_exec`` reads it)."""


def _spawn(
    command: list[str], env: dict[str, str], confine: Confinement, exec_child: ExecChild
) -> tuple[int, int]:
    """(pid, terminal master) of ``command`` started on a new pseudo-terminal as the job's
    user; NotStarted if it could not be executed."""
    master, slave = os.openpty()
    r, w = os.pipe()  # close-on-exec: EOF once the command has exec'd
    pid = os.fork()
    if pid == 0:  # the command's side: ends in exec or _exit
        os.close(master)
        os.close(r)
        os.login_tty(slave)  # a new session, this terminal its controlling one and its stdio
        confine.cgroups = []  # joined by the host already: inherited
        confine.terminal = None
        exec_child(command, env, 1, 2, confine, w)
        os._exit(127)
    os.close(slave)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        why = fh.read()
    if why:
        os.waitpid(pid, 0)
        os.close(master)
        raise NotStarted(why)
    os.set_blocking(master, False)
    return pid, master
