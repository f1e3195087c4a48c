"""A member's log cap: ``rank-R.out`` / ``rank-R.err`` never grow much past ``--log-limit``.

The launcher holds both logs open (the job's stdout and stderr are the same open files), so it
can cut them whatever the job does with its own descriptors, and a cut frees the blocks at once
(deleting a log frees nothing while the job holds it open). Every ``POLL_S`` while the job runs,
and once more after it exits, each log over the limit is cut:

* the first time, back to its first half (``limit // 2`` bytes: how the job started, usually what
  explains a failure), followed by a note saying so -- the job's own log tells it and its owner
  what happened, and the launcher leaves ``rank-R.logcap`` in its records for the control plane,
  which turns it into the job's ``log-limit`` event;
* later, back to the end of that note: what the job wrote since the last check stays until the
  next one, so the log keeps its head and the newest output, never much more than the limit.

Both logs are opened ``O_APPEND`` (``member_records.open_log``): after a cut the job's next write
lands at the new end, not at its old offset (no sparse file of the old size). Between two checks
a job can write what the disk takes in ``POLL_S``; the store keeps its own reserve for that
(``store/reserve.py``). Standard library only: the launcher runs without ``site``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

POLL_S = 0.1
"""How often a running job's logs are measured (a ``fstat`` each: cheap)."""

MIN_LIMIT = 4096


def note(limit: int) -> bytes:
    return (
        f"\n[gpufence] log limit of {limit} bytes reached: the first {limit // 2} bytes are "
        "kept above this line; below it only the newest output survives, the rest is "
        "discarded (submit with a larger --log-limit, up to the partition's, to keep more)\n"
    ).encode()


class LogCap:
    """The cap on a member's log descriptors ``fds`` (see the module docstring)."""

    def __init__(self, fds: Sequence[int], limit: int) -> None:
        self.fds = tuple(fds)
        self.limit = max(limit, MIN_LIMIT)
        self.kept: dict[int, int] = {}
        """fd -> where its head and the note end (set at its first cut)."""
        self.dropped = 0
        """Bytes cut so far (as the logs' sizes said at each cut)."""

    def check(self) -> None:
        """Cut every log over the limit; errors (a log the job broke) are left alone."""
        for fd in self.fds:
            try:
                size = os.fstat(fd).st_size
                if size <= self.limit:
                    continue
                end = self.kept.get(fd)
                if end is None:
                    os.ftruncate(fd, self.limit // 2)
                    os.write(fd, note(self.limit))  # O_APPEND: right after the kept head
                    end = self.kept[fd] = os.fstat(fd).st_size
                else:
                    os.ftruncate(fd, end)
                self.dropped += size - end
            except OSError:
                continue

    @property
    def hit(self) -> bool:
        return bool(self.kept)


def record(path: Path, cap: LogCap) -> None:
    """``rank-R.logcap`` for the control plane: the limit and how much was cut (best effort:
    a full disk may refuse it; the note in the log is there either way)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"limit": cap.limit, "dropped": cap.dropped}, fh)
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
