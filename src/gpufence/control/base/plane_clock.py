"""The control plane's clock: the monotonic clock, offset once to read as wall time.

Every deadline the plane keeps -- a job's time limit, a notice's grace, idle reclaim, retry
back-offs -- is a stored timestamp (``started_at``, ``notice_at``, ...) plus a duration, compared
with "now". If "now" were the wall clock, stepping it back an hour would keep a 5-second limit
running for an hour, and stepping it forward a day would kill a 1-hour job at once. So "now" is

    anchor_wall + (monotonic() - anchor_mono)

which a wall-clock step cannot move. The anchor is taken from the wall clock once and kept in
``DATA/clock.json`` with the kernel's boot id: a restart on the same boot reads it back, so the
timestamps in the store and the plane's new "now" are on the same line and every deadline
resumes where it was, whatever the wall clock did in between. After a reboot (another boot id:
the monotonic clock started again, and no job process survived) the anchor is taken anew.

The readings still look like Unix times, so they serve for display and accounting; they drift
from the wall clock only by the steps it took since the anchor (NTP slewing moves both alike).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from gpufence.control.base.privatefs import write_private

log = logging.getLogger("gpufence.clock")

CLOCK_FILE = "clock.json"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class PlaneClock:
    """``now() = anchor_wall + (mono() - anchor_mono)``; ``wall`` and ``mono`` are injectable
    (tests step the wall clock; production reads ``time.time`` once and ``time.monotonic``)."""

    __slots__ = ("anchor_mono", "anchor_wall", "mono", "wall")

    def __init__(
        self,
        anchor_wall: float,
        anchor_mono: float,
        mono: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.anchor_wall = anchor_wall
        self.anchor_mono = anchor_mono
        self.mono = mono
        self.wall = wall
        """Read for the anchor and for ``wall_offset`` (a log line), never for "now"."""

    def __call__(self) -> float:
        return self.anchor_wall + (self.mono() - self.anchor_mono)

    def wall_offset(self) -> float:
        """How far the wall clock has stepped away from this clock (seconds, + = ahead)."""
        return self.wall() - self()


def boot_id() -> str:
    try:
        return BOOT_ID.read_text(encoding="ascii").strip()
    except OSError:
        return ""  # no /proc: every start is a new boot (anchor anew)


def anchored(
    data_dir: Path,
    wall: Callable[[], float] = time.time,
    mono: Callable[[], float] = time.monotonic,
    boot: str | None = None,
) -> PlaneClock:
    """The plane clock of ``data_dir``: the anchor kept there if it is of this boot, else a new
    one from ``wall`` (written back, 0600)."""
    boot = boot_id() if boot is None else boot
    path = data_dir / CLOCK_FILE
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        if boot and kept.get("boot_id") == boot:
            clock = PlaneClock(float(kept["wall"]), float(kept["mono"]), mono, wall)
            log.info(
                "clock: resumed this boot's anchor (wall clock %+.3f s away)", clock.wall_offset()
            )
            return clock
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # none yet, or unreadable: a new anchor (deadlines then restart from now)
    clock = PlaneClock(wall(), mono(), mono, wall)
    text = json.dumps({"boot_id": boot, "wall": clock.anchor_wall, "mono": clock.anchor_mono})
    write_private(path, text + "\n")
    return clock
