"""How busy a running job's GPUs are, for idle detection on real GPUs.

The executors report the CPU use of a job's process groups, which is all there is on fake GPUs.
On real GPUs a notebook can keep a GPU busy while its process sleeps in a CUDA call, so the
reconciler also asks NVML for the utilisation of the whole GPUs the job holds and takes the
larger of the two. MIG instances and shared GPUs have no per-job figure in NVML (utilisation
is per physical GPU, or not supported under MIG): for them the CPU figure stands.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from gpufence.control.gpus.nvml import NvmlError


class Utilization(Protocol):
    @property
    def gpu(self) -> int: ...  # percent of the last sample period a kernel ran


class UtilApi(Protocol):
    def nvmlInit(self) -> None: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object: ...
    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Utilization: ...


class GpuUtilization:
    """Utilisation (0..1) of whole GPUs by NVML index; None where NVML cannot tell."""

    def __init__(self, api: UtilApi) -> None:
        self._api = api
        api.nvmlInit()
        self._handles: dict[int, object] = {}

    def of(self, index: int) -> float | None:
        try:
            handle = self._handles.get(index)
            if handle is None:
                handle = self._handles[index] = self._api.nvmlDeviceGetHandleByIndex(index)
            return max(0.0, min(1.0, self._api.nvmlDeviceGetUtilizationRates(handle).gpu / 100))
        except NvmlError:
            return None


def job_activity(
    cpu: float, devices: Iterable[str], gpu_of: Callable[[int], float | None] | None
) -> float:
    """The job's activity: its CPU figure, raised by the busiest whole GPU it holds."""
    best = cpu
    if gpu_of is None:
        return best
    for dev in devices:
        if dev.isdigit():  # a GPU index; MIG devices are named by UUID
            u = gpu_of(int(dev))
            if u is not None:
                best = max(best, u)
    return best
