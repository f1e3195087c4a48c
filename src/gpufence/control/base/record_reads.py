"""Reading what a member's launcher recorded: its pid, whether a stop reached it, how and when
it exited (``rank-R.pid`` / ``rank-R.exit`` in the attempt's records directory, or the exit spool).

A record is trusted only where the job could not have written it (``_record``): a forged record
would name the process group a restarted control plane signals and kills. Standard library only,
below every layer that reads records (executors, recovery, the GPU side's foreign-process check).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufence.control.base.member_records import (
    exit_file,
    pid_file,
    private_spool,
    spool_file,
    started_file,
)

log = logging.getLogger("gpufence.executor")


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _record(adir: Path, rank: int, path: Path) -> Path | None:
    """Where to read the launcher record ``path`` of ``adir``: its records directory; for an
    attempt started before records moved there (none, but ``rank-R.*`` in ``adir``), ``adir``
    itself, trusted only if nobody but the server's user could write it (the job ran as that
    user, so a forged record gains it nothing). None: an untrusted record (logged)."""
    if path.parent.exists():
        return path
    legacy = adir / path.name
    try:
        st = os.lstat(adir)
    except OSError:
        return path
    if not legacy.exists():
        return path
    if st.st_uid == os.geteuid() and not st.st_mode & 0o022:
        return legacy
    log.error(
        "%s: the launcher record %s is in a directory of uid %d, which the job can write: not "
        "trusted (it could name anyone's process); rank %d is taken as ended with no exit code, "
        "its cgroup (if any) killed; without containment, check for its processes by hand",
        adir,
        legacy.name,
        st.st_uid,
        rank,
    )
    return None


def _code(rec: dict[str, Any] | None) -> int | None:
    code = rec.get("code") if rec is not None else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _exit_record(adir: Path, rank: int) -> dict[str, Any] | None:
    """The member's exit record with a code: ``rank-R.exit`` in the records directory or, where
    the launcher could not write there (full / read-only disk), the spool's (only a private
    one: ``member_records.private_spool``); None if it has none."""
    where = _record(adir, rank, exit_file(adir, rank))
    rec = read_json(where) if where is not None else None
    if _code(rec) is None and private_spool() is not None:
        rec = read_json(spool_file(adir, rank))
    return rec if _code(rec) is not None else None


def recorded_exit(adir: Path, rank: int) -> int | None:
    """The member's recorded exit code (``_exit_record``); None if it has none."""
    return _code(_exit_record(adir, rank))


def recorded_end(adir: Path, rank: int) -> float | None:
    """When the member's command ended, as its launcher recorded it; None if unknown."""
    t = (_exit_record(adir, rank) or {}).get("ended_unix")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
        return None
    return float(t)


def recorded_stop(adir: Path, rank: int) -> bool | None:
    """Whether a stop signal had reached the member before its command exited, as its launcher
    recorded it; None where unknown (no record, or one without ``stop``)."""
    stop = (_exit_record(adir, rank) or {}).get("stop")
    return stop if isinstance(stop, bool) else None


def stop_reached(adir: Path, ranks: int) -> bool | None:
    """``recorded_stop`` over an attempt's members (``combined_stop``)."""
    return combined_stop([recorded_stop(adir, rank) for rank in range(ranks)])


def combined_stop(seen: Sequence[bool | None]) -> bool | None:
    """An attempt's ``stop_reached`` from its members': True if a stop reached any, False if
    every one recorded that it reached none, else None (unknown)."""
    if any(s is True for s in seen):
        return True
    return False if seen and all(s is False for s in seen) else None


def recorded_pid(adir: Path, rank: int) -> tuple[int, int] | None:
    """(pid, start time) of the member's launcher as recorded in ``rank-R.pid`` (trusted only
    where the job could not have written it, see ``_record``); None if there is none."""
    where = _record(adir, rank, pid_file(adir, rank))
    rec = read_json(where) if where is not None else None
    if rec is None:
        return None
    pid, start = rec.get("pid"), rec.get("start_time")
    if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(start, int) or pid <= 1:
        return None
    return pid, start


def recorded_launcher(adir: Path, rank: int) -> tuple[int, int] | None:
    """(pid, start time) of the member's launcher from ``rank-R.started`` (the process below its
    supervisor, ``supervisor.py``): the member lives on in it if the supervisor is killed.
    None for a record without it (an older launcher, or the command never started)."""
    where = _record(adir, rank, started_file(adir, rank))
    rec = read_json(where) if where is not None else None
    if rec is None:
        return None
    pid, start = rec.get("launcher"), rec.get("launcher_start")
    if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(start, int) or pid <= 1:
        return None
    return pid, start


def forget_spooled_exits(adir: Path, ranks: int) -> None:
    """The control plane has persisted this attempt's exit: spooled records may go."""
    for rank in range(ranks):
        try:
            spool_file(adir, rank).unlink(missing_ok=True)
        except OSError as exc:
            log.debug("cannot remove the spooled exit record of %s rank %d: %s", adir, rank, exc)


SPOOL_KEEP_S = 7 * 86400.0


def prune_spool(max_age_s: float = SPOOL_KEEP_S) -> int:
    """Drop spooled exit records older than ``max_age_s`` (their data directory went away
    before its control plane could persist them); returns how many."""
    spool = private_spool()
    if spool is None:
        return 0
    try:
        entries = list(spool.iterdir())
    except OSError:
        return 0
    cutoff = time.time() - max_age_s
    dropped = 0
    for path in entries:
        try:
            if path.name.endswith(".exit") and path.stat().st_mtime < cutoff:
                path.unlink()
                dropped += 1
        except OSError:
            continue
    return dropped
