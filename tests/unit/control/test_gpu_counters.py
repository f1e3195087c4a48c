"""The GPU sampler's counters (``control/gpus/gpu_counters.py``) read from the fake NVML through
the same calls and error codes as on hardware: utilisation, memory, PCIe, NVLink rates, memory
per MIG instance, and None (never 0) for what a GPU cannot tell."""

from __future__ import annotations

import pytest

from gpufence.control.gpus.gpu_counters import CountedGpu, GpuCounters
from gpufence.telemetry.interconnect import pcie_bytes_per_s
from gpufence.testing.fake_nvml import FakeGpu, FakeMig, FakeNvml, a100_box, bus, hgx_h100

H100_NVLINK_GBPS = 7200.0  # the catalogue's aggregate for an H100 SXM (both directions)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _counters(
    gpus: list[FakeGpu], nvlink_gbps: float = H100_NVLINK_GBPS
) -> tuple[FakeNvml, GpuCounters, Clock]:
    nvml = FakeNvml(gpus)
    clock = Clock()
    counted = [CountedGpu(i, i, nvlink_gbps) for i in range(len(gpus))]
    return nvml, GpuCounters(nvml, counted, clock), clock


def test_utilisation_memory_and_pcie_of_each_gpu() -> None:
    nvml, counters, _ = _counters(hgx_h100(2))
    g = nvml.gpus[1]
    g.util, g.mem_used_mib = 73, 4096
    g.pcie_tx_kbs, g.pcie_rx_kbs = 8_000_000, 2_000_000  # 8 GB/s out, 2 GB/s in
    s0, s1 = counters.sample()
    assert (s0.utilization, s0.memory_used_bytes) == (0.0, 0)
    assert s1.utilization == pytest.approx(0.73)
    assert s1.memory_used_bytes == 4096 << 20
    assert s1.memory_total_bytes == 81559 << 20
    assert (s1.pcie_tx_bytes_s, s1.pcie_rx_bytes_s) == (8e9, 2e9)
    cap = pcie_bytes_per_s(5, 16)
    assert cap is not None and s1.pcie_capacity_bytes_s == pytest.approx(cap)
    assert s1.pcie_utilization == pytest.approx(8e9 / cap)  # the busier direction


def test_nvlink_is_a_rate_between_two_passes() -> None:
    nvml, counters, clock = _counters(hgx_h100(1))
    first = counters.sample()[0]
    assert first.nvlink_tx_bytes_s is None and first.nvlink_utilization is None  # one reading
    nvml.gpus[0].send(450e9, 225e9)  # over 2 s: 225 GB/s out, 112.5 GB/s in
    clock.t += 2.0
    s = counters.sample()[0]
    assert s.nvlink_tx_bytes_s == pytest.approx(225e9, rel=1e-6)
    assert s.nvlink_rx_bytes_s == pytest.approx(112.5e9, rel=1e-6)
    # 7200 Gbit/s both ways = 450 GB/s each way: (225 + 112.5) / 900 of it is carried
    assert s.nvlink_utilization == pytest.approx(337.5 / 900, rel=1e-6)


def test_what_a_gpu_cannot_tell_is_none_not_zero() -> None:
    pcie_only = FakeGpu("NVIDIA L4", 23034, bus(0), links=None)  # no NVLink at all
    _, counters, clock = _counters([pcie_only], nvlink_gbps=0.0)
    counters.sample()
    clock.t += 1.0
    s = counters.sample()[0]
    assert s.nvlink_tx_bytes_s is None and s.nvlink_utilization is None
    assert s.utilization == 0.0  # a real 0 % is still 0


def test_mig_gpus_give_memory_per_instance_and_no_utilisation() -> None:
    gpus = a100_box()  # GPU 3 is in MIG mode with two instances
    gpus[3].mem_used_mib = 1000
    gpus[3].mig_used_mib = {"MIG-aaaa": 512}
    _, counters, _ = _counters(gpus, nvlink_gbps=4800.0)
    s = counters.sample()[3]
    assert s.utilization is None  # NVML has none in MIG mode (GPM / DCGM has it per instance)
    by_uuid = {m.uuid: m for m in s.migs}
    assert set(by_uuid) == {"MIG-aaaa", "MIG-bbbb"}
    assert by_uuid["MIG-aaaa"].memory_used_bytes == 512 << 20
    assert by_uuid["MIG-aaaa"].memory_total_bytes == 40192 << 20
    assert by_uuid["MIG-bbbb"].memory_used_bytes == 0
    assert (by_uuid["MIG-aaaa"].gi_id, by_uuid["MIG-bbbb"].gi_id) == (1, 5)  # GPU_I_ID
    board = s.board_fields()
    assert {m["uuid"] for m in board["mig_memory"]} == {"MIG-aaaa", "MIG-bbbb"}  # type: ignore[union-attr]
    assert counters.sample()[0].migs == ()  # not in MIG mode: no instances


def test_an_nvml_error_skips_that_gpu_and_not_the_others() -> None:
    nvml = FakeNvml(hgx_h100(2))
    gone = CountedGpu(1, 7)  # NVML answers INVALID_ARGUMENT for an index it no longer has
    counters = GpuCounters(nvml, [CountedGpu(0, 0), gone, CountedGpu(2, 1)], Clock())
    assert [s.gid for s in counters.sample()] == [0, 2]


def test_fake_mig_used_memory_defaults_to_zero() -> None:
    mig = FakeMig("MIG-x", gi_id=1, profile_id=9, start=0, size=4, slices=3, mem_mb=40192)
    g = FakeGpu("NVIDIA A100-SXM4-80GB", 81920, bus(0), mig_mode=(1, 1), migs=[mig])
    _, counters, _ = _counters([g])
    assert counters.sample()[0].migs[0].memory_used_bytes == 0
