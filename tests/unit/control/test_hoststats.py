"""This machine's NIC and storage rates (``control/observe/hoststats.py``) from the kernel's own
counters: real traffic over loopback, real writes to the data dir's disk, and a hand-made
``/proc/diskstats`` for exact figures."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from gpufence.control.observe.hoststats import DISKSTATS, NET_ROOT, HostStats


class Clock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def _loopback_traffic(n_bytes: int) -> None:
    """Send ``n_bytes`` through a real TCP connection on 127.0.0.1."""
    srv = socket.create_server(("127.0.0.1", 0))
    got = 0

    def drain() -> None:
        nonlocal got
        conn, _ = srv.accept()
        with conn:
            while chunk := conn.recv(1 << 16):
                got += len(chunk)

    t = threading.Thread(target=drain)
    t.start()
    with socket.create_connection(srv.getsockname()) as c:
        c.sendall(b"x" * n_bytes)
    t.join(10)
    srv.close()
    assert got == n_bytes


def test_loopback_throughput_is_counted_and_has_no_line_rate(tmp_path: Path) -> None:
    if not (NET_ROOT / "lo" / "statistics" / "rx_bytes").exists():
        pytest.skip("no /sys/class/net/lo/statistics on this machine")
    clock = Clock()
    host = HostStats(tmp_path, ["lo"], clock=clock)
    assert host.sample().nics == ()  # the first sample is only a baseline
    _loopback_traffic(8 << 20)
    clock.t += 2.0
    (lo,) = host.sample().nics
    assert lo.device == "lo"
    # loopback counts each byte once sent and once received: at least 8 MiB / 2 s each way
    assert lo.rx_bytes_s >= (8 << 20) / 2.0
    assert lo.tx_bytes_s >= (8 << 20) / 2.0
    assert lo.capacity_bytes_s is None and lo.utilization is None  # no speed for lo
    assert host.latest().nics == (lo,)


def test_every_device_is_counted_by_default_and_a_missing_one_is_skipped(tmp_path: Path) -> None:
    net = tmp_path / "net"
    for dev, speed in (("eth9", "1000"), ("lo", None)):
        (net / dev / "statistics").mkdir(parents=True)
        (net / dev / "statistics" / "tx_bytes").write_text("1000\n")
        (net / dev / "statistics" / "rx_bytes").write_text("0\n")
        if speed:
            (net / dev / "speed").write_text(speed + "\n")
    clock = Clock()
    host = HostStats(tmp_path, None, net_root=net, clock=clock)
    host.sample()
    (net / "eth9" / "statistics" / "tx_bytes").write_text(str(1000 + 62_500_000) + "\n")
    clock.t += 1.0
    by_dev = {n.device: n for n in host.sample().nics}
    assert set(by_dev) == {"eth9", "lo"}
    eth = by_dev["eth9"]
    assert eth.tx_bytes_s == pytest.approx(62.5e6)  # 500 Mbit/s of a 1 Gbit/s NIC
    assert eth.capacity_bytes_s == pytest.approx(125e6)
    assert eth.utilization == pytest.approx(0.5)
    only = HostStats(tmp_path, ["eth9", "nope0"], net_root=net, clock=clock)
    only.sample()
    clock.t += 1.0
    assert [n.device for n in only.sample().nics] == ["eth9"]


def _diskstats_line(
    major: int, minor: int, reads: int, ms_r: int, writes: int, ms_w: int, busy_ms: int
) -> str:
    f = [reads, 0, reads * 8, ms_r, writes, 0, writes * 8, ms_w, 0, busy_ms, ms_r + ms_w]
    return f"{major:4d} {minor:7d} vdz " + " ".join(str(x) for x in f) + " 0 0 0 0\n"


def test_storage_wait_and_busy_share_between_two_samples(tmp_path: Path) -> None:
    dev = os.stat(tmp_path).st_dev
    if os.major(dev) == 0:
        pytest.skip("the tmp dir is on a filesystem without a block device (overlay/tmpfs)")
    mj, mn = os.major(dev), os.minor(dev)
    stats = tmp_path / "diskstats"
    stats.write_text(
        "   7       0 loop0 1 0 0 0 0 0 0 0 0 0 0\n"
        + _diskstats_line(mj, mn, 100, 200, 50, 300, 1000)
    )
    clock = Clock()
    host = HostStats(tmp_path, [], diskstats=stats, clock=clock)
    first = host.sample()
    assert first.disk is None and first.disk_note == "first sample"
    # 10 reads waiting 30 ms and 30 writes waiting 170 ms in 2 s, busy 500 ms of them
    stats.write_text(_diskstats_line(mj, mn, 110, 230, 80, 470, 1500))
    clock.t += 2.0
    d = host.sample().disk
    assert d is not None and d.device == "vdz"
    assert d.await_s == pytest.approx(0.200 / 40)
    assert d.busy == pytest.approx(0.25)
    clock.t += 1.0  # no I/O in between: no wait to speak of, not busy
    d = host.sample().disk
    assert d is not None and d.await_s is None and d.busy == 0.0


def test_the_real_data_dir_device_after_real_writes(tmp_path: Path) -> None:
    dev = os.stat(tmp_path).st_dev
    if os.major(dev) == 0 or not DISKSTATS.exists():
        pytest.skip("the tmp dir has no block device in /proc/diskstats on this machine")
    host = HostStats(tmp_path, [])
    host.sample()
    with open(tmp_path / "blob", "wb") as f:
        for _ in range(16):
            f.write(os.urandom(1 << 20))
            f.flush()
            os.fsync(f.fileno())
    s = host.sample()
    assert s.disk is not None, s.disk_note
    assert s.disk.await_s is not None and s.disk.await_s >= 0.0  # fsync completed writes
    assert 0.0 <= s.disk.busy <= 1.0


def test_a_data_dir_without_a_block_device_says_so(tmp_path: Path) -> None:
    proc = Path("/proc")  # procfs: st_dev major 0
    if os.major(os.stat(proc).st_dev) != 0:
        pytest.skip("/proc has a block device here")
    s = HostStats(proc, []).sample()
    assert s.disk is None and "without a block device" in s.disk_note
