"""The plane clock's anchor: resumed on the same boot, taken anew after a reboot or when the
file is unreadable; its readings never follow a wall-clock step."""

from __future__ import annotations

import stat
from pathlib import Path

from gpufence.control.base.plane_clock import CLOCK_FILE, anchored


class Fake:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_the_same_boot_resumes_the_anchor_whatever_the_wall_clock_did(tmp_path: Path) -> None:
    wall, mono = Fake(1_000_000.0), Fake(50.0)
    first = anchored(tmp_path, wall, mono, boot="b1")
    assert first() == 1_000_000.0
    assert stat.S_IMODE((tmp_path / CLOCK_FILE).stat().st_mode) == 0o600
    mono.t, wall.t = 60.0, 5.0  # 10 s later, the wall clock stepped to 1970
    assert first() == 1_000_010.0
    again = anchored(tmp_path, wall, mono, boot="b1")
    assert again() == 1_000_010.0 and again.wall_offset() == 5.0 - 1_000_010.0


def test_a_new_boot_or_a_damaged_file_takes_a_new_anchor(tmp_path: Path) -> None:
    wall, mono = Fake(1_000.0), Fake(50.0)
    anchored(tmp_path, wall, mono, boot="b1")
    wall.t, mono.t = 2_000.0, 3.0  # rebooted: the monotonic clock started again
    assert anchored(tmp_path, wall, mono, boot="b2")() == 2_000.0
    (tmp_path / CLOCK_FILE).write_text("{not json")
    wall.t = 3_000.0
    assert anchored(tmp_path, wall, mono, boot="b2")() == 3_000.0
