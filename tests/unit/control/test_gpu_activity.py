"""Idle detection on real GPUs: NVML utilisation of the job's whole GPUs raises its CPU figure."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpufence.control.gpus.activity import GpuUtilization, job_activity
from gpufence.control.gpus.nvml import NVML_ERROR_NOT_SUPPORTED, NvmlError


@dataclass
class Rates:
    gpu: int


class FakeUtil:
    def __init__(self, util: dict[int, int | None]) -> None:
        self.util = util
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Rates:
        value = self.util[int(handle)]  # type: ignore[call-overload]
        if value is None:
            raise NvmlError(NVML_ERROR_NOT_SUPPORTED)
        return Rates(value)


@pytest.mark.parametrize(
    ("cpu", "devices", "want"),
    [
        (0.0, ["0"], 0.9),  # sleeping in a CUDA call: busy by its GPU
        (0.5, ["1"], 0.5),  # idle GPU, busy CPU: the CPU figure stands
        (0.0, ["0", "1"], 0.9),  # the busiest GPU of the job counts
        (0.0, ["2"], 0.0),  # NVML cannot tell: CPU only
        (0.2, ["MIG-3f1c"], 0.2),  # MIG instances have no per-instance utilisation
        (0.0, [], 0.0),  # CPU-only job
    ],
)
def test_job_activity(cpu: float, devices: list[str], want: float) -> None:
    util = GpuUtilization(FakeUtil({0: 90, 1: 0, 2: None}))
    assert job_activity(cpu, devices, util.of) == pytest.approx(want)


def test_without_nvml_the_cpu_figure_is_used() -> None:
    assert job_activity(0.3, ["0"], None) == 0.3
