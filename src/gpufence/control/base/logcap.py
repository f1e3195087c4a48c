"""A member's log cap: ``rank-R.out`` / ``rank-R.err`` never grow past ``--log-limit``.

The job does not write its logs itself. Its stdout and stderr are pipes, and a *log pump* (a
process the launcher forks, ``pump``) copies them into the files, so every byte goes through
``CappedLog.write`` and the cap holds exactly, however fast the job prints and however full the
disk is. (Polling a file the job writes directly cannot: on a fast disk a job writes hundreds of
megabytes between two checks, and on a full one it takes every block the last cut freed. Slurm's
step daemon and the container runtimes' monitors forward a job's output the same way.)

Past the limit a log keeps

* its first half (``limit // 2`` bytes: how the job started, usually what explains a failure),
  followed by a note saying so -- the job's own log tells it and its owner what happened, and
  ``rank-R.logcap`` in the launcher's records tells the control plane, which turns it into the
  job's ``log-limit`` event;
* then only the newest output: when that part would pass the limit, it is cut back to the end of
  the note and the new bytes go on from there.

A write the disk refuses (full, failing) is dropped and counted, never retried: the job is never
held up by the disk. The pipes apply back-pressure instead: a job can print no faster than the
pump copies. The pump runs in the job's cgroup (its CPU is the job's) as the control plane's
user (the job cannot signal it); it ignores the signals sent to the member's group and ends when
the job's side of both pipes is closed, or, told by the launcher that the job exited, once it has
copied what is left in them. If the launcher is killed, the pump goes on until the job ends, so
the job never dies of a broken pipe. Standard library only: the launcher runs without ``site``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

MIN_LIMIT = 4096
CHUNK = 1 << 16
DONE = b"d"
"""What the launcher writes to the pump's control pipe once the job has exited."""


def note(limit: int) -> bytes:
    return (
        f"\n[gpufence] log limit of {limit} bytes reached: the first {limit // 2} bytes are "
        "kept above this line; below it only the newest output survives, the rest is "
        "discarded (submit with a larger --log-limit, up to the partition's, to keep more)\n"
    ).encode()


class CappedLog:
    """One log file (an ``O_APPEND`` descriptor) that never grows past ``limit`` bytes."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fd = fd
        self.limit = max(limit, MIN_LIMIT)
        self.kept: int | None = None
        """Where its head and the note end (set at its first cut)."""
        self.dropped = 0
        """Bytes not kept: cut from the file, or refused by the disk."""

    def write(self, data: bytes) -> None:
        try:
            size = os.fstat(self.fd).st_size  # the launcher may have written a line too
            if size + len(data) > self.limit:
                size = self._cut(size)
                room = self.limit - size
                if len(data) > room:  # more than the tail holds: its newest part
                    self.dropped += len(data) - room
                    data = data[len(data) - room :]
            self._append(data)
        except OSError:
            self.dropped += len(data)

    def _cut(self, size: int) -> int:
        """Make room: the first time keep the head and add the note, later go back to the
        note's end. Returns the new size."""
        if self.kept is None:
            head = min(size, self.limit // 2)
            os.ftruncate(self.fd, head)
            self.dropped += size - head
            self.kept = head  # if the note is refused, the head alone is kept
            with contextlib.suppress(OSError):
                os.write(self.fd, note(self.limit))  # O_APPEND: right after the head
                self.kept = os.fstat(self.fd).st_size
            return self.kept
        os.ftruncate(self.fd, self.kept)
        self.dropped += size - self.kept
        return self.kept

    def _append(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except OSError:
                self.dropped += len(view)
                return
            view = view[n:]

    @property
    def hit(self) -> bool:
        return self.kept is not None


def _drain(fd: int, log: CappedLog) -> None:
    """Copy what ``fd`` holds now, without waiting for more."""
    os.set_blocking(fd, False)
    with contextlib.suppress(BlockingIOError, OSError):
        while data := os.read(fd, CHUNK):
            log.write(data)


def copy(
    pipes: Sequence[tuple[int, CappedLog]], control: int, on_first_cut: Callable[[], None]
) -> None:
    """The pump's loop: each pipe into its log until the job's side of all of them is closed;
    ``control`` saying ``DONE`` ends it after a last drain. ``control`` closed without it means
    the launcher died: go on until the pipes close."""
    logs = dict(pipes)
    poll = select.poll()
    for fd in (*logs, control):
        poll.register(fd, select.POLLIN)
    cut = False
    while logs:
        for fd, _ in poll.poll():
            if fd == control:
                if os.read(control, 1) == DONE:
                    for r, log in logs.items():
                        _drain(r, log)
                    return
                poll.unregister(control)  # the launcher is gone
                continue
            data = os.read(fd, CHUNK)
            if data:
                logs[fd].write(data)
            else:
                poll.unregister(fd)
                del logs[fd]
        if not cut and any(log.hit for _, log in pipes):
            cut = True
            on_first_cut()


class Pump:
    """The launcher's handle on its log pump (see the module docstring)."""

    def __init__(
        self,
        log_fds: Sequence[int],
        limit: int,
        record: Path,
        reads: Sequence[int] | None = None,
    ) -> None:
        """``reads``: the pipes' read ends when the job's process was given the write ends
        already (a pre-started member); else the pipes are made here."""
        self.logs = [CappedLog(fd, limit) for fd in log_fds]
        self.record = record
        if reads is None:
            ends = [os.pipe() for _ in log_fds]
            reads = [r for r, _ in ends]
            self.writes: list[int] = [w for _, w in ends]
            """The job's stdout and stderr (the launcher closes its copies once it has them)."""
        else:
            self.writes = []
        self.reads = list(reads)
        self.control_r, self.control_w = os.pipe()
        self.pid: int | None = None

    def start(self, cgroups: Sequence[str], close_others: Callable[[Sequence[int]], None]) -> None:
        """Fork the pump: into the job's ``cgroups`` (best effort: out of them it still caps),
        every descriptor but its own closed, every signal blocked."""
        pid = os.fork()
        if pid:
            self.pid = pid
            for fd in (*self.reads, self.control_r, *self.writes):
                os.close(fd)
            return
        code = 0  # pragma: no cover - the pump's side, ends in _exit
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            close_others([*self.reads, self.control_r, *(log.fd for log in self.logs)])
            for d in cgroups:
                with contextlib.suppress(OSError):
                    _join(d)
            copy(list(zip(self.reads, self.logs, strict=True)), self.control_r, self._say)
            self._say()
        except BaseException:
            code = 1
        finally:
            os._exit(code)

    def _say(self) -> None:
        if any(log.hit for log in self.logs):
            write_record(self.record, self.logs)

    def finish(self) -> None:
        """The job has exited: the pump copies what is left, then ends; wait for it."""
        if self.pid is None:
            return
        with contextlib.suppress(OSError):
            os.write(self.control_w, DONE)
        os.close(self.control_w)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self.pid = None

    def abandon(self) -> None:
        """The job never started (the pump was not either): nothing to copy."""
        for fd in (*self.writes, *self.reads, self.control_r, self.control_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _join(directory: str) -> None:
    fd = os.open(os.path.join(directory, "cgroup.procs"), os.O_WRONLY)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)


def write_record(path: Path, logs: Sequence[CappedLog]) -> None:
    """``rank-R.logcap`` for the control plane: the limit and how much was dropped (best effort:
    a full disk may refuse it; the note in the log is there either way)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"limit": logs[0].limit, "dropped": sum(x.dropped for x in logs)}, fh)
    except OSError:
        pass


def read_record(path: Path) -> tuple[int, int] | None:
    """(limit, bytes dropped) of a ``rank-R.logcap``; None if there is none (or unreadable)."""
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
        return int(raw["limit"]), int(raw["dropped"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
