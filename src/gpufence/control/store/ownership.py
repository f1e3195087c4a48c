"""One control plane per store, enforced on the store itself.

Two control planes on one store would run every job twice. The guard is not a lock *file* next to
the store (anyone can delete that) but:

1. an exclusive ``flock`` on the database file itself, held for the store's lifetime (it is
   independent of SQLite's own POSIX byte-range locks, and goes with the process: a ``kill -9``
   frees it);
2. an owner row in ``meta`` (pid, process start time, boot id, host), claimed at open and
   re-checked in every write transaction together with the file's identity: if the database
   file was deleted or replaced under a running control plane (someone "cleaned up"), that plane
   stops writing (503) instead of diverging from whatever is at the path now, and a second plane
   started on a *copy* refuses while the owner it names still runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from gpufence.control.base.privatefs import PRIVATE_FILE
from gpufence.control.store.errors import StoreError


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return ""


def _start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    if fields[:1] == [b"Z"]:
        # a zombie (a killed server whose parent never reaps it, as in a container without an
        # init) runs nothing and holds no lock: it must not keep the store from a new server
        return None
    return int(fields[19]) if len(fields) > 19 else None


@dataclass(frozen=True, slots=True)
class Owner:
    pid: int
    start_time: int
    boot_id: str
    host: str
    since: float

    @staticmethod
    def me() -> Owner:
        pid = os.getpid()
        return Owner(pid, _start_time(pid) or 0, _boot_id(), socket.gethostname(), time.time())

    def same_process(self, other: Owner) -> bool:
        return (self.pid, self.start_time, self.boot_id, self.host) == (
            other.pid,
            other.start_time,
            other.boot_id,
            other.host,
        )

    def alive(self) -> bool:
        """Does the process this row names still run (on this machine, since this boot)?"""
        if self.host != socket.gethostname() or self.boot_id != _boot_id():
            return False  # another machine's (shared disk) or from before a reboot
        return _start_time(self.pid) == self.start_time

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Owner | None:
        try:
            raw = json.loads(text)
            return Owner(
                int(raw["pid"]),
                int(raw["start_time"]),
                str(raw["boot_id"]),
                str(raw["host"]),
                float(raw["since"]),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on {self.host}, since {when}"


class FileLock:
    """An exclusive ``flock`` on the database file (created empty, mode 0600, if missing; never
    through a symbolic link)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # set first: __del__ runs on a half-made lock too (the refusal below, an open that
        # failed), and must find nothing to release rather than raise AttributeError
        self._fd: int | None = None
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, PRIVATE_FILE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(
                f"another gpufence control plane uses the store {path}; stop it first or "
                "start this one with another --data (two on one store would run jobs twice)"
            ) from None
        self._fd = fd
        st = os.fstat(fd)
        self.identity = (st.st_dev, st.st_ino)

    def still_at_path(self) -> bool:
        """Is the file we hold still the one at ``path`` (not deleted, not replaced)?"""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.identity

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __del__(self) -> None:
        self.release()
