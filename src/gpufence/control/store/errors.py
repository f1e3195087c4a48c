"""What can go wrong with the store, in words a user can act on.

``StoreError``: the store cannot be used as it is (newer schema, damaged, another control plane
owns it); the control plane refuses to start. ``StoreUnavailable``: a write or read failed for a
reason outside the program (disk full, read-only file system, I/O error, the file was replaced);
the API answers 503 ``store unavailable: <reason>`` and the reconciler keeps what it observed in
memory until the store takes writes again. ``IllegalStateChange`` (a ``StoreError``): the
control plane asked the store for a move of a job's state that the lifecycle table
(``model/lifecycle.py``) does not have: a bug, refused before anything is written.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import time

log = logging.getLogger("gpufence.store")


class StoreError(RuntimeError):
    """The store cannot be used (the message says why and what to do)."""


class IllegalStateChange(StoreError):
    """A write would move a job between two states the lifecycle table does not connect."""

    def __init__(self, job_id: str, old: str, new: str) -> None:
        super().__init__(
            f"job {job_id}: {old} -> {new} is not a move of the job lifecycle"
            " (model/lifecycle.py); nothing was written"
        )
        self.job_id, self.old, self.new = job_id, old, new


class StoreUnavailable(RuntimeError):
    """The store cannot take this read or write right now; ``reason`` in a few words."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"store unavailable: {reason}")
        self.reason = reason


_BY_CODE = {
    "SQLITE_FULL": "disk full",
    "SQLITE_READONLY": "read-only",
    "SQLITE_IOERR": "I/O error",
    "SQLITE_CANTOPEN": "cannot open the database file",
    "SQLITE_CORRUPT": "database damaged",
    "SQLITE_NOTADB": "database damaged",
    "SQLITE_BUSY": "database busy",
    "SQLITE_LOCKED": "database busy",
}
_BY_ERRNO = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only",
    errno.EIO: "I/O error",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}


def reason_of(exc: BaseException) -> str | None:
    """A short reason if ``exc`` is a fault of the store's medium, else None (a bug)."""
    if isinstance(exc, StoreUnavailable):
        return exc.reason
    if isinstance(exc, sqlite3.Error):
        name = getattr(exc, "sqlite_errorname", "") or ""
        for prefix, reason in _BY_CODE.items():
            if name.startswith(prefix):
                return reason
        text = str(exc).lower()
        for words, reason in (
            ("disk is full", "disk full"),
            ("readonly", "read-only"),
            ("read-only", "read-only"),
            ("disk i/o", "I/O error"),
            ("malformed", "database damaged"),
            ("unable to open", "cannot open the database file"),
            ("locked", "database busy"),
        ):
            if words in text:
                return reason
        return None
    if isinstance(exc, OSError) and exc.errno in _BY_ERRNO:
        return _BY_ERRNO[exc.errno]
    return None


def unavailable(exc: BaseException) -> StoreUnavailable | None:
    reason = reason_of(exc)
    return StoreUnavailable(reason) if reason is not None else None


def medium_fault(exc: BaseException) -> bool:
    """The store's medium failed (full disk, I/O error, gone), as opposed to a bug."""
    return isinstance(exc, StoreUnavailable) or unavailable(exc) is not None


def integrity_problem(conn: sqlite3.Connection, budget_s: float) -> str | None:
    """What ``PRAGMA quick_check`` found wrong (None: nothing, or out of time, logged)."""
    deadline = time.monotonic() + budget_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        rows = [str(r[0]) for r in conn.execute("PRAGMA quick_check(20)").fetchall()]
    except sqlite3.OperationalError as exc:
        if "interrupt" not in str(exc):
            raise
        log.warning("integrity check of the store stopped after %.0f s: not verified", budget_s)
        return None
    finally:
        conn.set_progress_handler(None, 0)
    return None if rows == ["ok"] else "; ".join(rows[:5])
