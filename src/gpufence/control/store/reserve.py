"""The store's own free-space reserve: cancels, exits and reads keep working on a full disk.

Jobs' logs are on the data directory's file system. Each is capped (``base/logcap.py``), but a
job's own files are not, and other programs share the disk: it fills. Space freed by
deleting a reserve file would go to whoever writes first -- likely the job. Free pages *inside*
the database file cannot: SQLite takes a new page from its own free list before it grows the
file, so a transaction that fits in the free list writes over blocks the file already has and
never meets ENOSPC.

So the store keeps ``want`` bytes of free pages (``top_up``): it inserts a blob of zeros of the
missing size and deletes it again, in two transactions, and checkpoints: the pages are written
(real blocks, not a sparse hole) and then free, and the write-ahead log has grown to that size
too (it is rewritten from its start after each checkpoint, so it needs no new blocks either). It
does so only while the file system has room to spare (``HEADROOM`` times the missing part): the
reserve never takes the last of a disk. The reconciler calls it after its cycles, at most once
per ``TOP_UP_EVERY_S``.

New jobs must not eat the reserve that cancels and exits need: while the file system has less
than ``want`` free and the free list is below half of it, a submit is refused (HTTP 507, naming
the data directory and what to do) -- every other write goes on. ``want`` is
``control.store_reserve_mib`` (0: no reserve).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path

from gpufence.control.base.config import DEFAULT_RESERVE_MIB

log = logging.getLogger("gpufence.store")

__all__ = ["DEFAULT_RESERVE_MIB", "SpaceLow", "SpaceReserve"]
HEADROOM = 4
"""The reserve is made only while the disk has this many times the missing bytes free."""
TOP_UP_EVERY_S = 5.0


class SpaceLow(RuntimeError):
    """A submit refused because the data directory's disk is (nearly) full (HTTP 507)."""


class SpaceReserve:
    """``want`` bytes of free pages in the store at ``conn`` (see the module docstring)."""

    def __init__(self, conn: sqlite3.Connection, data_dir: Path, want: int) -> None:
        self._c = conn
        self.data_dir = data_dir
        self.want = max(0, want)
        self._next = 0.0

    def free_pages_bytes(self) -> int:
        """Bytes of the store's free list (what a transaction can use without new blocks)."""
        page = int(self._c.execute("PRAGMA page_size").fetchone()[0])
        return page * int(self._c.execute("PRAGMA freelist_count").fetchone()[0])

    def disk_free(self) -> int:
        try:
            st = os.statvfs(self.data_dir)
        except OSError:
            return 0
        return st.f_bavail * st.f_frsize

    def top_up(self, now: float | None = None) -> None:
        """Refill the reserve if it is short and the disk has room (at most once per
        ``TOP_UP_EVERY_S`` unless ``now`` is None). Errors of the medium are left to the next
        transaction to report; this only tries."""
        clock = time.monotonic() if now is None else now
        if self.want == 0 or (now is not None and clock < self._next):
            return
        self._next = clock + TOP_UP_EVERY_S
        try:
            missing = self.want - self.free_pages_bytes()
            if missing <= 0 or self.disk_free() < HEADROOM * missing:
                return
            self._fill(missing)
        except sqlite3.Error as exc:
            log.warning("the store's free-space reserve was not refilled: %s", exc)

    def _fill(self, size: int) -> None:
        """The blob in, then out; not fsynced (free pages need no durability: a crash loses
        the reserve at worst, which the next top-up makes again)."""
        c = self._c
        was = int(c.execute("PRAGMA synchronous").fetchone()[0])
        c.execute("PRAGMA synchronous=OFF")
        try:
            self._blob_in_and_out(size)
        finally:
            c.execute(f"PRAGMA synchronous={was}")

    def _blob_in_and_out(self, size: int) -> None:
        c = self._c
        for sql, args in (
            ("INSERT OR REPLACE INTO meta(key, value) VALUES('space-reserve', zeroblob(?))", size),
            ("DELETE FROM meta WHERE key = 'space-reserve'", None),
        ):
            c.execute("BEGIN IMMEDIATE")
            try:
                c.execute(sql, (args,) if args is not None else ())
            except BaseException:
                c.execute("ROLLBACK")
                raise
            c.execute("COMMIT")
        c.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def submit_refusal(self) -> str | None:
        """Why a new job must not be stored now (None: it may)."""
        if self.want == 0:
            return None
        free = self.disk_free()
        if free >= self.want or self.free_pages_bytes() >= self.want // 2:
            return None
        return (
            f"the data directory's file system ({self.data_dir}) is full ({free >> 20} MiB "
            "free): new jobs are refused so that cancels and exits keep landing in the store's "
            "reserve; cancel jobs that flood their logs or free space there, then submit again"
        )
