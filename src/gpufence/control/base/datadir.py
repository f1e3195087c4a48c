"""Which directory gpufence may take as its data dir, and whether its store is still there.

``gpufence up --data DIR`` makes DIR private (0700 or 0711) and every file directly in it 0600.
That is right for gpufence's own directory and ruinous for another's: ``--data /srv`` or
``--data .`` would lock other users out of their files. So an existing directory is taken only
if it is empty or already holds something of gpufence's (``OWN_NAMES``); anything else is
refused before a single byte or mode changes (``check_data_dir``).

The store marks its directory: ``DATA/store.id`` is written once a store has been opened there
(``mark_store``). A start that finds the marker but no ``gpufence.db`` knows the store was
deleted or moved -- perhaps under a running server, which keeps it open and answers 503 -- and
refuses rather than begin a new, empty store in which every acknowledged job would be gone
(``check_store_present``). Deleting the marker is how to start afresh on purpose.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from gpufence.control.base.privatefs import create_private

STORE_MARK = "store.id"
DB_NAME = "gpufence.db"
OWN_NAMES = frozenset(
    {
        DB_NAME,
        f"{DB_NAME}-wal",
        f"{DB_NAME}-shm",
        f"{DB_NAME}-journal",
        STORE_MARK,
        "admin.token",
        "server.json",
        "clock.json",
        "jobs",
    }
)
"""Names only a gpufence data dir holds (any one of them makes a directory gpufence's)."""
_SHOWN = 5


class DataDirError(ValueError):
    """The directory cannot be gpufence's data dir; the message says why and what to do."""


def check_data_dir(data_dir: Path) -> None:
    """Refuse an existing ``data_dir`` that is not a directory, or that holds files and none of
    gpufence's. Changes nothing."""
    if not data_dir.exists() and not data_dir.is_symlink():
        return
    if not data_dir.is_dir():
        raise DataDirError(f"{data_dir} is not a directory; give --data a directory")
    names = sorted(p.name for p in data_dir.iterdir())
    if not names or OWN_NAMES.intersection(names):
        return
    more = len(names) - _SHOWN
    shown = ", ".join(names[:_SHOWN]) + (f" and {more} more" if more > 0 else "")
    raise DataDirError(
        f"--data {data_dir} is not a gpufence data directory (it holds {shown}, and nothing "
        "of gpufence's): gpufence would make it and its files private. Give --data a new or "
        "empty directory, e.g. ~/.gpufence"
    )


def check_store_present(data_dir: Path) -> None:
    """Refuse a data dir whose store was made and is now missing (deleted or moved)."""
    mark = data_dir / STORE_MARK
    db = data_dir / DB_NAME
    if not mark.exists() or (db.exists() and db.stat().st_size > 0):
        return
    made = ""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        created = float(json.loads(mark.read_text())["created"])
        made = " on " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))
    raise DataDirError(
        f"the store {db} is missing, but {mark} says one was made here{made}: it was deleted "
        "or moved, and a new empty store would lose every job it held. Put it back (with its "
        f"-wal file); to start a new, empty store here on purpose, delete {mark}"
    )


def mark_store(data_dir: Path) -> None:
    """Note that a store lives in ``data_dir`` (once; kept for as long as the directory)."""
    create_private(data_dir / STORE_MARK, json.dumps({"created": time.time()}) + "\n")
