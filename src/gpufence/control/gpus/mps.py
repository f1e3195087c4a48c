"""MPS control daemons: what enforces fractional shares on a real GPU.

One ``nvidia-cuda-mps-control`` per GPU of a fractional partition, started by the control plane
in the foreground (``-f``) in its own session, with ``CUDA_VISIBLE_DEVICES`` = that GPU's UUID
and its pipe and log directories in the data dir (``DATA/mps/gpu-<index>/{pipe,log}``). A share
on that GPU is an MPS client: it gets the pipe directory and its limits (``memberenv.mps_env``),
so the MPS server caps its compute (active thread percentage) and the device memory it can pin.

The daemon's pid and start time are kept in ``DATA/mps/gpu-<index>/daemon.json``: a restarted
control plane adopts a daemon that still runs (jobs connected to it keep running) instead of
starting a second one. ``check`` (every GPU sample) restarts a daemon that died; ``stop`` asks
it to ``quit`` (then SIGTERM, then SIGKILL its session).

Where the executable is missing or will not start, the GPU's shares are not enforced: that is
said at start-up, on ``nodes`` (the board) and on the partition (``enforced: false``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpufence.control.base.member_records import (
    atomic_write,
    proc_start_time,
    proc_stat_fields,
)
from gpufence.control.gpus.board import GpuBoard
from gpufence.control.metrics import Telemetry

log = logging.getLogger("gpufence.mps")

MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_DIR = "mps"
READY_S = 2.0  # how long a started daemon may take to open its pipes
STOP_S = 5.0


@dataclass(frozen=True)
class MpsGpu:
    gid: int  # global GPU id
    index: int  # NVML / CUDA index on this node
    uuid: str


@dataclass
class _Daemon:
    gpu: MpsGpu
    root: Path
    pid: int = 0
    start_time: int = 0
    popen: subprocess.Popen[bytes] | None = None  # ours; None when adopted
    state: str = "stopped"
    restarts: int = 0

    @property
    def pipe(self) -> Path:
        return self.root / "pipe"

    @property
    def logs(self) -> Path:
        return self.root / "log"

    @property
    def record(self) -> Path:
        return self.root / "daemon.json"

    def alive(self) -> bool:
        if self.pid <= 0:
            return False
        if self.popen is not None:
            return self.popen.poll() is None
        fields = proc_stat_fields(self.pid)  # a zombie has exited: not alive
        return (
            fields is not None
            and len(fields) > 19
            and fields[0] not in "ZX"
            and (int(fields[19]) == self.start_time)
        )


class MpsDaemons:
    """The MPS control daemons of this node's fractional GPUs (see the module docstring)."""

    def __init__(
        self,
        data_dir: Path,
        gpus: Iterable[MpsGpu],
        board: GpuBoard,
        telemetry: Telemetry | None = None,
        binary: str = MPS_CONTROL,
    ) -> None:
        self.root = data_dir / MPS_DIR
        self.board = board
        self.telemetry = telemetry
        self.binary = shutil.which(binary)
        self.wanted = binary
        self._daemons = {g.gid: _Daemon(g, self.root / f"gpu-{g.index}") for g in gpus}

    @property
    def unavailable(self) -> str | None:
        """Why MPS cannot run here (None: the executable is there)."""
        if self.binary is None:
            return f"{self.wanted} is not on PATH (install the NVIDIA driver's MPS tools)"
        return None

    def pipe_dir(self, gid: int) -> str | None:
        d = self._daemons.get(gid)
        return str(d.pipe) if d is not None and d.state == "running" else None

    def system_pids(self) -> set[int]:
        return {d.pid for d in self._daemons.values() if d.pid > 0}

    def gpus(self) -> list[int]:
        return list(self._daemons)

    # ------------------------------------------------------------------ start / adopt
    def start_all(self) -> None:
        why = self.unavailable
        for d in self._daemons.values():
            if why is not None:
                self._set(d, "unavailable", why)
                continue
            if self._adopt(d):
                continue
            self._start(d)

    def _set(self, d: _Daemon, state: str, detail: str = "") -> None:
        d.state = state
        text = state if not detail else f"{state}: {detail}"
        self.board.set(d.gpu.gid, mps=text, mps_restarts=d.restarts or None)

    def _adopt(self, d: _Daemon) -> bool:
        try:
            rec = json.loads(d.record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        pid, start = rec.get("pid"), rec.get("start_time")
        if not isinstance(pid, int) or not isinstance(start, int) or pid <= 1:
            return False
        if proc_start_time(pid) != start:
            return False
        d.pid, d.start_time, d.popen = pid, start, None
        self._set(d, "running", f"pid {pid} (adopted)")
        log.info("GPU %d: adopted the MPS control daemon pid %d", d.gpu.index, pid)
        return True

    def _start(self, d: _Daemon) -> bool:
        assert self.binary is not None
        for sub in (d.pipe, d.logs):
            sub.mkdir(parents=True, exist_ok=True)
            # MPS clients (jobs, maybe of other run_as users) connect through the pipe
            # directory: they must pass through DATA/mps and DATA/mps/gpu-N to reach it
            os.chmod(sub, 0o755)
        os.chmod(self.root, 0o711)
        os.chmod(d.root, 0o711)
        for stale in d.pipe.iterdir():  # pipes and pid file of a daemon that is gone
            with contextlib.suppress(OSError):
                stale.unlink()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CUDA_VISIBLE_DEVICES": d.gpu.uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(d.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(d.logs),
        }
        out = open(d.logs / "gpufence-daemon.out", "ab")  # noqa: SIM115 (the child keeps it)
        try:
            popen = subprocess.Popen(
                [self.binary, "-f"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            self._set(d, "failed", f"cannot run {self.binary}: {exc}")
            log.error("GPU %d: cannot start the MPS control daemon: %s", d.gpu.index, exc)
            return False
        finally:
            out.close()
        d.pid, d.popen = popen.pid, popen
        d.start_time = proc_start_time(popen.pid) or 0
        # ready once it has put something in its pipe directory (its pid file, its pipes), or
        # has stayed up for READY_S; it failed if it exited
        end = time.monotonic() + READY_S
        while time.monotonic() < end and popen.poll() is None and not any(d.pipe.iterdir()):
            time.sleep(0.02)
        code = popen.poll()
        if code is not None:
            tail = _tail(d.logs / "gpufence-daemon.out")
            why = f"{self.binary} -f exited with {code}"
            self._set(d, "failed", f"{why}{': ' + tail if tail else ''}")
            log.error("GPU %d: the MPS control daemon did not start (%s)", d.gpu.index, why)
            d.pid = 0
            return False
        atomic_write(d.record, json.dumps({"pid": d.pid, "start_time": d.start_time}) + "\n")
        self._set(d, "running", f"pid {d.pid}")
        log.info("GPU %d: MPS control daemon pid %d (pipe %s)", d.gpu.index, d.pid, d.pipe)
        return True

    # ------------------------------------------------------------------ supervision
    def check(self) -> list[int]:
        """Restart every daemon that died; the GPUs whose daemon was restarted."""
        restarted: list[int] = []
        for d in self._daemons.values():
            if d.state != "running" or d.alive():
                continue
            code = d.popen.poll() if d.popen is not None else None
            d.restarts += 1
            log.warning(
                "GPU %d: the MPS control daemon pid %d died (exit %s); restarting it (jobs "
                "sharing the GPU may have lost their CUDA context)",
                d.gpu.index,
                d.pid,
                code,
            )
            if self.telemetry is not None:
                self.telemetry.mps_restarted(d.gpu.index)
            d.pid = 0
            if self._start(d):
                restarted.append(d.gpu.gid)
        return restarted

    def stop(self, gids: Iterable[int] | None = None) -> None:
        """Stop the daemons of ``gids`` (all when None): ``quit``, then signals."""
        chosen = self._daemons if gids is None else {g: self._daemons[g] for g in gids}
        for d in chosen.values():
            if not d.alive():
                continue
            if self.binary is not None:
                env = {"PATH": os.environ.get("PATH", ""), "CUDA_MPS_PIPE_DIRECTORY": str(d.pipe)}
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(
                        [self.binary],
                        input=b"quit\n",
                        env=env,
                        timeout=STOP_S,
                        check=False,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
            end = time.monotonic() + STOP_S
            while time.monotonic() < end and d.alive():
                time.sleep(0.02)
            if d.alive():
                _end(d)
            d.record.unlink(missing_ok=True)
            self._set(d, "stopped")
            d.pid = 0


def _end(d: _Daemon) -> None:
    """SIGTERM the daemon's session, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(d.pid, sig)
        end = time.monotonic() + 1.0
        while time.monotonic() < end and d.alive():
            time.sleep(0.02)
        if not d.alive():
            break
    if d.popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            d.popen.wait(0.5)


def _tail(path: Path, n: int = 300) -> str:
    try:
        return path.read_bytes()[-n:].decode(errors="replace").strip().replace("\n", " | ")
    except OSError:
        return ""
