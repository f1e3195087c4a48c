"""Issue 11, case 2 (launcher side): an exit record survives a data disk that takes no writes.

``member_records.write_exit_record`` on a real file system: into the space reserved at spawn
when the disk is full, into the spool when it is read-only, and it keeps trying (the launcher
lives on, so the member still looks alive and nothing replaces it) while neither can be written.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from disks import SmallDisk, require_root, small_disk

from gpufence.control.base.member_records import (
    SPOOL_ENV,
    atomic_write,
    exit_file,
    private_spool,
    records_dir,
    reserved_exit_record,
    spool_file,
    write_exit_record,
)
from gpufence.control.base.record_reads import forget_spooled_exits, recorded_exit


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    require_root()
    with small_disk(tmp_path / "disk", "4m") as d:
        yield d


def _attempt(disk: SmallDisk) -> Path:
    adir = disk.path / "jobs" / "j1" / "attempt-1"
    adir.mkdir(parents=True)
    records_dir(adir).mkdir()
    atomic_write(exit_file(adir, 0), reserved_exit_record())  # what the executor does at spawn
    assert recorded_exit(adir, 0) is None  # reserved: "not exited yet"
    return adir


def test_a_full_disk_takes_the_record_into_its_reserved_space(disk: SmallDisk) -> None:
    adir = _attempt(disk)
    disk.fill()
    assert write_exit_record(adir, 0, 3, time.time()) == "reserved"
    assert recorded_exit(adir, 0) == 3


def test_a_read_only_disk_sends_the_record_to_the_spool(
    disk: SmallDisk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SPOOL_ENV, str(tmp_path / "spool"))
    adir = _attempt(disk)
    disk.read_only(True)
    try:
        assert write_exit_record(adir, 0, 0, time.time()) == "spool"
        assert recorded_exit(adir, 0) == 0  # readers look in the spool too
    finally:
        disk.read_only(False)
    forget_spooled_exits(adir, 1)  # the control plane persisted it
    assert recorded_exit(adir, 0) is None and not list((tmp_path / "spool").iterdir())


def test_with_nowhere_to_write_it_keeps_the_code_until_it_can(
    disk: SmallDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SPOOL_ENV, str(disk.path / "spool"))  # on the same, read-only disk
    adir = _attempt(disk)
    disk.read_only(True)
    got: list[str] = []
    writer = threading.Thread(target=lambda: got.append(write_exit_record(adir, 0, 7, 1.0)))
    try:
        writer.start()
        time.sleep(0.5)
        assert writer.is_alive() and not got, "gave up on the record"
    finally:
        disk.read_only(False)
    writer.join(10)
    assert got == ["reserved"] and recorded_exit(adir, 0) == 7


def test_a_spool_someone_else_could_write_is_neither_read_nor_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/dev/shm`` is writable by every user: a job that makes the spool directory first (or
    one left group/other-writable) could plant exit records there to have a restarted control
    plane settle an attempt as done. Such a spool is ignored (``member_records.private_spool``)."""
    squat = tmp_path / "spool"
    squat.mkdir()
    squat.chmod(0o777)
    monkeypatch.setenv(SPOOL_ENV, str(squat))
    adir = tmp_path / "jobs" / "j1" / "attempt-1"
    adir.mkdir(parents=True)
    records_dir(adir).mkdir()
    atomic_write(exit_file(adir, 0), reserved_exit_record())
    (squat / spool_file(adir, 0).name).write_text('{"code": 0, "ended_unix": 1.0}\n')
    assert private_spool(create=True) is None
    assert recorded_exit(adir, 0) is None, "a forged record in a shared spool was believed"
    squat.chmod(0o700)  # the control plane's own again: its records count
    assert private_spool() == squat and recorded_exit(adir, 0) == 0
