"""The demo's model of its fake GPUs' counters: what the fake NVML reports while jobs run.

On fake GPUs nothing runs on a device, so NVML's counters have nothing to count. The demo still
wants the GPU sampler's whole path exercised (NVML calls -> rates -> board -> /metrics and the
series), so a thread sets the fake NVML's counters (``gpufence.testing.fake_nvml``) from what
holds each GPU, by the job's class: a training gang computes and all-reduces over NVLink, a
serving replica moves requests over PCIe, a notebook works for its ``--busy-s`` then idles.
These figures are a model, and the demo's summary says so; the serving latencies, the NIC
(loopback) and the storage figures beside them are measured.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpufence.control.base.config import ADMIN
from gpufence.control.gpus.nvml import GpuApi
from gpufence.control.plane import ControlPlane

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class Load:
    util: int  # percent
    mem_gib: float
    pcie_kbs: int  # each direction, KB/s
    nvlink_bytes_s: float  # each direction


TRAINING = Load(90, 60, 1_000_000, 120e9)  # a quarter of an H100's 450 GB/s each way
SERVING = Load(35, 30, 2_000_000, 0.0)
NOTEBOOK_BUSY = Load(50, 20, 200_000, 0.0)
IDLE_HELD = Load(0, 20, 0, 0.0)  # an idle notebook still holds its memory
BATCH = Load(80, 40, 500_000, 0.0)
FREE = Load(0, 0, 0, 0.0)


class ModelledGpu(Protocol):
    """The counters of one fake GPU (``gpufence.testing.fake_nvml.FakeGpu``)."""

    util: int
    mem_used_mib: int
    pcie_tx_kbs: int
    pcie_rx_kbs: int

    def send(self, tx_bytes: float, rx_bytes: float = 0.0) -> None: ...


class FakeDevices(GpuApi, Protocol):
    """A fake NVML whose GPUs' counters can be set (``gpufence.testing.fake_nvml.FakeNvml``:
    the CLI hands it in, as the demo sits below the testing helpers)."""

    @property
    def gpus(self) -> Sequence[ModelledGpu]: ...


class FakeGpuModel:
    """A thread that sets the fake NVML's counters every ``every_s`` (see the docstring)."""

    def __init__(self, plane: ControlPlane, nvml: FakeDevices, every_s: float = 0.25) -> None:
        self.plane = plane
        self.nvml = nvml
        self.every_s = every_s
        self._jobs: dict[str, tuple[str, float | None, int]] = {}  # id -> (class, busy_s, size)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-gpu-model", daemon=True)

    def start(self) -> FakeGpuModel:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _job(self, jid: str) -> tuple[str, float | None, int]:
        if jid not in self._jobs:
            row = self.plane.job(jid, ADMIN)
            if row is None:
                return "batch", None, 1
            cmd = list(row.spec.get("command", []))
            busy = float(cmd[cmd.index("--busy-s") + 1]) if "--busy-s" in cmd else None
            size = int(row.spec.get("replicas", 1)) * int(row.spec.get("gpus", 1))
            self._jobs[jid] = (row.workload_class, busy, size)
        return self._jobs[jid]

    def _load(self, jid: str, now: float) -> Load:
        cls, busy_s, size = self._job(jid)
        if cls == "training":
            return TRAINING if size > 1 else BATCH
        if cls == "serving":
            return SERVING
        if cls == "interactive":
            row = self.plane.job(jid, ADMIN)
            started = row.started_at if row is not None else None
            working = started is not None and busy_s is not None and now - started < busy_s
            return NOTEBOOK_BUSY if working else IDLE_HELD
        return BATCH

    def _run(self) -> None:
        last = time.time()
        while not self._stop.wait(self.every_s):
            now = time.time()
            dt, last = now - last, now
            try:
                nodes = self.plane.nodes(ADMIN)
            except Exception:  # the plane is closing
                continue
            for g in nodes[0]["gpus"] if nodes else ():
                jobs = g.get("jobs") or []
                load = self._load(jobs[0], now) if jobs else FREE
                _apply(self.nvml.gpus[g["index"]], load, dt)


def _apply(gpu: ModelledGpu, load: Load, dt: float) -> None:
    gpu.util = load.util
    gpu.mem_used_mib = int(load.mem_gib * 1024)
    gpu.pcie_tx_kbs = gpu.pcie_rx_kbs = load.pcie_kbs
    if load.nvlink_bytes_s:
        gpu.send(load.nvlink_bytes_s * dt, load.nvlink_bytes_s * dt)
