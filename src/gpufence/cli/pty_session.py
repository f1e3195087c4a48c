"""The user's terminal joined to a job's (``terminal_link.py``), for ``run --pty`` and
``attach``.

On a terminal, stdin goes raw (every key, Ctrl-C included, is the job's: its own terminal
interprets them) and is restored however the session ends; the window size is sent at the start
and on every SIGWINCH. Stdin that is no terminal (a pipe, a file) is sent as it comes, then, at
its end, Ctrl-D: an end of input for the job's terminal, so ``echo 'echo hi' | gpufence run
--pty -- bash`` runs the line and ends.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import termios
import tty
from collections.abc import Iterator

from gpufence.cli.terminal_link import Output, TerminalLink

EOT = b"\x04"


def _leave(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """The terminal raw until the block ends, however it ends: SIGTERM and SIGHUP unwind it
    (the job lives on for its grace) rather than leave the user's terminal raw."""
    saved = termios.tcgetattr(fd)
    old = {sig: signal.signal(sig, _leave) for sig in (signal.SIGTERM, signal.SIGHUP)}
    tty.setraw(fd, termios.TCSADRAIN)  # not TCSAFLUSH: what was typed ahead is the job's
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        for sig, handler in old.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def winch_pipe() -> Iterator[int]:
    """A descriptor that becomes readable when the window size changes."""
    r, w = os.pipe()
    os.set_blocking(w, False)

    def note(_signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):
            os.write(w, b"w")

    old = signal.signal(signal.SIGWINCH, note)
    try:
        yield r
    finally:
        signal.signal(signal.SIGWINCH, old)
        os.close(r)
        os.close(w)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _send_size(link: TerminalLink) -> None:
    size = shutil.get_terminal_size()
    link.send_resize(size.lines, size.columns)


class Session:
    """One relay: ``run`` returns the command's exit code, or None when the link was lost
    first (``lost`` says why)."""

    def __init__(self, link: TerminalLink) -> None:
        self.link = link
        self.stdin = sys.stdin.fileno()
        self.stdout = sys.stdout.fileno()
        self.interactive = os.isatty(self.stdin)
        self.lost = ""

    def run(self) -> int | None:
        sys.stdout.flush()
        if not self.interactive:
            return self._relay(None)
        with raw_mode(self.stdin), winch_pipe() as winch:
            _send_size(self.link)
            return self._relay(winch)

    def _relay(self, winch: int | None) -> int | None:
        reading = True
        out = self.link.buffered()
        while True:
            if out.data:
                _write_all(self.stdout, out.data)
            if out.exit_code is not None:
                return out.exit_code
            if out.closed:
                self.lost = out.reason
                return None
            watch = [
                self.link.sock,
                *([self.stdin] if reading else []),
                *([winch] if winch is not None else []),
            ]
            ready = select.select(watch, [], [])[0]
            if winch is not None and winch in ready:
                os.read(winch, 64)
                _send_size(self.link)
            if reading and self.stdin in ready:
                reading = self._forward_input()
            out = self.link.read() if self.link.sock in ready else Output()

    def _forward_input(self) -> bool:
        """Send what stdin has; False at its end (after sending Ctrl-D for it)."""
        data = os.read(self.stdin, 65536)
        if data:
            self.link.send_input(data)
            return True
        self.link.send_input(EOT)
        return False
