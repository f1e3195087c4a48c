"""MPS control daemons as real processes (a fake ``nvidia-cuda-mps-control`` on PATH): one per
fractional GPU, started with that GPU's UUID and pipe/log directories in the data dir; a daemon
that dies is restarted; stop asks it to quit; a restarted control plane adopts a running one;
where the executable is missing or fails, the GPU is marked unenforced."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufence.control.gpus.board import GpuBoard
from gpufence.control.gpus.mps import MpsDaemons, MpsGpu
from gpufence.control.metrics import Telemetry
from gpufence.testing.fake_mps import install, log_lines, path_with
from gpufence.testing.waiting import until

GPUS = [MpsGpu(0, 0, "GPU-aaaa"), MpsGpu(1, 1, "GPU-bbbb")]


@pytest.fixture
def fake_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    install(bin_dir)
    monkeypatch.setenv("PATH", path_with(bin_dir))
    return bin_dir


@pytest.fixture
def daemons(tmp_path: Path, fake_on_path: Path) -> Iterator[MpsDaemons]:
    made = MpsDaemons(tmp_path / "data", GPUS, GpuBoard(), Telemetry())
    yield made
    made.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


def test_one_daemon_per_gpu_with_its_uuid_and_directories(
    tmp_path: Path, daemons: MpsDaemons
) -> None:
    daemons.start_all()
    for g in GPUS:
        root = tmp_path / "data" / "mps" / f"gpu-{g.index}"
        assert daemons.pipe_dir(g.gid) == str(root / "pipe")
        (line,) = log_lines(root)
        kind, pid, uuid = line.split()
        assert kind == "start" and uuid == g.uuid and _alive(int(pid))
        assert (root / "log").is_dir() and (root / "daemon.json").exists()
        assert daemons.board.gpu(g.gid)["mps"] == f"running: pid {pid}"
    assert len(daemons.system_pids()) == 2


def test_a_daemon_that_dies_is_restarted(tmp_path: Path, daemons: MpsDaemons) -> None:
    daemons.start_all()
    root = tmp_path / "data" / "mps" / "gpu-0"
    first = int(log_lines(root)[0].split()[1])
    os.kill(first, signal.SIGKILL)
    until(lambda: not _alive(first) or _reap(daemons), 5, "the daemon to die")
    assert daemons.check() == [0]
    second = int(log_lines(root)[-1].split()[1])
    assert second != first and _alive(second)
    assert daemons.board.gpu(0)["mps_restarts"] == 1
    assert daemons.telemetry is not None
    assert b'gpufence_mps_daemon_restarts_total{gpu="0"} 1.0' in daemons.telemetry.render()
    assert daemons.check() == []  # alive: nothing to do


def _reap(d: MpsDaemons) -> bool:
    return not d._daemons[0].alive()  # polls (reaps) our child


def test_stop_asks_the_daemon_to_quit(tmp_path: Path, daemons: MpsDaemons) -> None:
    daemons.start_all()
    pids = daemons.system_pids()
    daemons.stop([0])
    root = tmp_path / "data" / "mps" / "gpu-0"
    assert log_lines(root)[-1].startswith("quit ")
    assert daemons.pipe_dir(0) is None and daemons.pipe_dir(1) is not None
    assert not (root / "daemon.json").exists()
    assert len(pids - daemons.system_pids()) == 1


def test_a_restarted_control_plane_adopts_a_running_daemon(
    tmp_path: Path, daemons: MpsDaemons
) -> None:
    daemons.start_all()
    again = MpsDaemons(tmp_path / "data", GPUS, GpuBoard())
    again.start_all()
    for g in GPUS:
        assert len(log_lines(tmp_path / "data" / "mps" / f"gpu-{g.index}")) == 1  # not started
        assert "(adopted)" in again.board.gpu(g.gid)["mps"]
    assert again.system_pids() == daemons.system_pids()
    again.stop()
    until(lambda: not any(_alive(p) for p in daemons.system_pids()), 5, "daemons gone")


def test_a_daemon_that_will_not_start_leaves_the_gpu_unenforced(
    tmp_path: Path, daemons: MpsDaemons
) -> None:
    root = tmp_path / "data" / "mps" / "gpu-1"
    root.mkdir(parents=True)
    (root / "fail").write_text("")
    started = time.monotonic()
    daemons.start_all()
    assert time.monotonic() - started < 5
    assert daemons.pipe_dir(0) is not None and daemons.pipe_dir(1) is None
    state = daemons.board.gpu(1)["mps"]
    assert state.startswith("failed: ") and "exited with 3" in state and "no GPU here" in state


def test_no_executable_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    d = MpsDaemons(tmp_path / "data", GPUS, GpuBoard())
    assert (
        d.unavailable
        == "nvidia-cuda-mps-control is not on PATH (install the NVIDIA driver's MPS tools)"
    )
    d.start_all()
    assert d.pipe_dir(0) is None
    assert d.board.gpu(0)["mps"].startswith("unavailable: nvidia-cuda-mps-control is not on PATH")
