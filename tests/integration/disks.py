"""Real file-system faults for the store tests: a small tmpfs that fills up or goes read-only,
and an ext4 on a loop device whose backing file runs out of room (real I/O errors).

Needs root (mount, losetup); a machine without them skips with the reason. Everything is
mounted under the test's ``tmp_path`` and unmounted (lazily: job processes may still hold
files there) when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError:  # the tool is not installed: callers skip with the reason
        return subprocess.CompletedProcess(cmd, 127, "", f"{cmd[0]}: not installed")


class SmallDisk:
    """A tmpfs of ``size`` at ``path``: ``fill()`` it, ``free()`` it, make it read-only."""

    def __init__(self, path: Path, size: str) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        r = _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "gpufence-test", str(path))
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs (needs root): {r.stderr.strip()}")
        self._filler = path / ".filler"

    def fill(self) -> None:
        """Write until the disk says ENOSPC (kept open nowhere: only its blocks matter)."""
        chunk = b"\0" * (1 << 16)
        with contextlib.suppress(OSError), self._filler.open("ab") as fh:
            while True:
                fh.write(chunk)
                fh.flush()
        with contextlib.suppress(OSError), (self.path / ".filler2").open("ab") as fh:
            while True:  # the last partial block
                fh.write(b"\0")
                fh.flush()

    def free(self) -> None:
        for f in (self._filler, self.path / ".filler2"):
            f.unlink(missing_ok=True)

    def read_only(self, on: bool) -> None:
        r = _run("mount", "-o", f"remount,{'ro' if on else 'rw'}", str(self.path))
        assert r.returncode == 0, r.stderr

    def close(self) -> None:
        _run("umount", "-l", str(self.path))


class FailingDisk:
    """ext4 on a loop device over a sparse 64 MiB file on a 6 MiB tmpfs: once the tmpfs is
    full, writes to the device fail and ext4 returns I/O errors (then remounts read-only).
    ``repair()`` gives the backing tmpfs room, checks the file system and mounts it again."""

    def __init__(self, root: Path) -> None:
        self.backing = SmallDisk(root / "backing", "6m")
        self.path = root / "disk"
        self.path.mkdir(parents=True, exist_ok=True)
        img = self.backing.path / "img"
        steps = [
            ("truncate", "-s", "64M", str(img)),
            ("mkfs.ext4", "-q", "-F", str(img)),
        ]
        for cmd in steps:
            r = _run(*cmd)
            if r.returncode != 0:
                self.backing.close()
                pytest.skip(f"{cmd[0]} failed: {r.stderr.strip()}")
        r = _run("losetup", "-f", "--show", str(img))
        if r.returncode != 0:
            self.backing.close()
            pytest.skip(f"no loop device: {r.stderr.strip()}")
        self.device = r.stdout.strip()
        r = _run("mount", self.device, str(self.path))
        if r.returncode != 0:
            self.close()
            pytest.skip(f"cannot mount ext4 on {self.device}: {r.stderr.strip()}")

    def break_it(self) -> None:
        self.backing.fill()

    def repair(self) -> None:
        _run("umount", "-l", str(self.path))
        self.backing.free()
        _run("mount", "-o", "remount,size=128m", str(self.backing.path))
        _run("e2fsck", "-fy", self.device)
        r = _run("mount", self.device, str(self.path))
        assert r.returncode == 0, r.stderr

    def close(self) -> None:
        _run("umount", "-l", str(self.path))
        if getattr(self, "device", None):
            _run("losetup", "-d", self.device)
        self.backing.close()


@contextlib.contextmanager
def small_disk(path: Path, size: str = "24m") -> Iterator[SmallDisk]:
    disk = SmallDisk(path, size)
    try:
        yield disk
    finally:
        disk.free()
        disk.close()


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("file-system fault tests need root (mount)")
