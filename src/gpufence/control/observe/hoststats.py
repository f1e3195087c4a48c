"""This machine's network and storage I/O from the kernel's own counters.

* **NICs**: ``/sys/class/net/<dev>/statistics/{tx,rx}_bytes`` (bytes since the device came up)
  -> bytes/s between two samples; utilisation over the line rate ``/sys/class/net/<dev>/speed``
  (Mbit/s; none for loopback and virtual devices: their utilisation is unknown, their
  throughput is still real);
* **storage** of the data directory (the store, logs and checkpoints live there): the block
  device holding it (``st_dev`` -> ``/proc/diskstats`` by major:minor) -> between two samples
  the mean wait per I/O (iostat's ``await``: ms reading + ms writing over I/Os completed) and
  the share of time it was busy (``%util``: ms doing I/O over wall time). A data dir on a
  filesystem without a block device (overlay, tmpfs, NFS) has no storage figures, and says so.

The sampler thread (``gpus/runtime.py``) calls ``sample()``; readers take ``latest()``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufence.telemetry.interconnect import counter_rate, duplex_utilization

NET_ROOT = Path("/sys/class/net")
DISKSTATS = Path("/proc/diskstats")


@dataclass(frozen=True, slots=True)
class NicRate:
    device: str
    tx_bytes_s: float
    rx_bytes_s: float
    capacity_bytes_s: float | None  # per direction; None: no line rate (loopback, virtual)
    utilization: float | None


@dataclass(frozen=True, slots=True)
class DiskRate:
    device: str
    await_s: float | None  # None: no I/O completed between the samples
    busy: float


@dataclass(frozen=True, slots=True)
class HostSample:
    t: float  # wall time of the sample
    nics: tuple[NicRate, ...] = ()
    disk: DiskRate | None = None
    disk_note: str = ""  # why there is no disk figure


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _disk_row(diskstats: Path, major: int, minor: int) -> tuple[str, list[int]] | None:
    try:
        text = diskstats.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 14 and f[0] == str(major) and f[1] == str(minor):
            return f[2], [int(x) for x in f[3:14]]
    return None


class HostStats:
    """Rates of this machine's NICs and of the data dir's block device (module docstring)."""

    def __init__(
        self,
        data_dir: Path,
        devices: Sequence[str] | None = None,
        net_root: Path = NET_ROOT,
        diskstats: Path = DISKSTATS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.devices = None if devices is None else tuple(devices)
        self.net_root = net_root
        self.diskstats = diskstats
        self.clock = clock
        self.wall = wall
        self._dev = self._block_device(data_dir)
        self._nic_prev: dict[str, tuple[float, int, int]] = {}
        self._disk_prev: tuple[float, list[int]] | None = None
        self._lock = threading.Lock()
        self._latest = HostSample(wall())

    @staticmethod
    def _block_device(data_dir: Path) -> tuple[int, int] | None:
        try:
            dev = os.stat(data_dir).st_dev
        except OSError:
            return None
        return (os.major(dev), os.minor(dev)) if os.major(dev) != 0 else None

    def _nic_names(self) -> list[str]:
        if self.devices is not None:
            return list(self.devices)
        try:
            return sorted(p.name for p in self.net_root.iterdir())
        except OSError:
            return []

    def _nics(self, now: float) -> tuple[NicRate, ...]:
        out = []
        for name in self._nic_names():
            stats = self.net_root / name / "statistics"
            tx, rx = _read_int(stats / "tx_bytes"), _read_int(stats / "rx_bytes")
            if tx is None or rx is None:
                continue
            prev = self._nic_prev.get(name)
            self._nic_prev[name] = (now, tx, rx)
            if prev is None:
                continue
            tx_s = counter_rate((prev[0], prev[1]), (now, tx))
            rx_s = counter_rate((prev[0], prev[2]), (now, rx))
            if tx_s is None or rx_s is None:
                continue  # the device was re-created, or the clock did not move
            mbit = _read_int(self.net_root / name / "speed")
            cap = mbit * 1e6 / 8 if mbit is not None and mbit > 0 else None
            out.append(NicRate(name, tx_s, rx_s, cap, duplex_utilization(tx_s, rx_s, cap)))
        return tuple(out)

    def _disk(self, now: float) -> tuple[DiskRate | None, str]:
        if self._dev is None:
            return None, "the data dir is on a filesystem without a block device"
        row = _disk_row(self.diskstats, *self._dev)
        if row is None:
            return None, f"no /proc/diskstats row for device {self._dev[0]}:{self._dev[1]}"
        name, f = row
        # f: reads, reads merged, sectors read, ms reading, writes, writes merged, sectors
        # written, ms writing, I/Os in flight, ms doing I/O, weighted ms
        prev, self._disk_prev = self._disk_prev, (now, f)
        if prev is None or now <= prev[0]:
            return None, "first sample"
        p = prev[1]
        ios = (f[0] - p[0]) + (f[4] - p[4])
        waited_ms = (f[3] - p[3]) + (f[7] - p[7])
        busy = min(max((f[9] - p[9]) / ((now - prev[0]) * 1000.0), 0.0), 1.0)
        await_s = waited_ms / ios / 1000.0 if ios > 0 else None
        return DiskRate(name, await_s, busy), ""

    def sample(self) -> HostSample:
        now = self.clock()
        nics = self._nics(now)
        disk, note = self._disk(now)
        s = HostSample(self.wall(), nics, disk, note)
        with self._lock:
            self._latest = s
        return s

    def latest(self) -> HostSample:
        with self._lock:
            return self._latest
