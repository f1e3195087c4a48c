"""The counters the GPU sampler reads from NVML on every pass: utilisation, memory, PCIe and
NVLink throughput per GPU, memory per MIG instance.

* utilisation: ``nvmlDeviceGetUtilizationRates().gpu`` (share of the last sample period a
  kernel ran; NVML gives none for a GPU in MIG mode);
* memory used / total: ``nvmlDeviceGetMemoryInfo`` of the GPU, and of each MIG device (with
  its GPU instance id, ``nvmlDeviceGetGpuInstanceId``: dcgm-exporter's job-mapping file names);
* PCIe: ``nvmlDeviceGetPcieThroughput`` (tx and rx, KB/s over NVML's own 20 ms sample), over
  the link's per-direction bandwidth (``nvmlDeviceGetMaxPcieLinkGeneration`` x width, read
  once: the *current* generation drops while the GPU idles);
* NVLink: the data counters ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}`` summed over the
  GPU's links (``nvmlDeviceGetFieldValues``, KiB since the driver loaded): a rate between two
  passes, over the GPU type's aggregate NVLink bandwidth (catalogue). The per-link utilisation
  counters (``nvmlDeviceGetNvLinkUtilizationCounter``) are deprecated and absent on Hopper.

Utilisation of a MIG instance is not sampled: NVML has it only through GPM (DCGM's
``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` per ``GPU_I_ID`` gives it). Whatever a GPU or driver cannot
tell (NOT_SUPPORTED, NO_PERMISSION...) is None, never 0. Definitions: ``telemetry.interconnect``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpufence.control.gpus.nvml import (
    NVML_DEVICE_MIG_ENABLE,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    NVML_PCIE_UTIL_RX_BYTES,
    NVML_PCIE_UTIL_TX_BYTES,
    NVML_SCOPE_ALL_LINKS,
    NVML_SUCCESS,
    GpuApi,
    NvmlError,
    as_text,
    maybe,
)
from gpufence.telemetry.interconnect import (
    counter_rate,
    duplex_utilization,
    nvlink_utilization,
    pcie_bytes_per_s,
)

log = logging.getLogger("gpufence.gpus")
KB = 1000  # NVML's PCIe throughput unit (nvidia-smi dmon divides by 1000 for MB/s)
KIB = 1024  # the NVLink throughput fields' unit
_NVLINK_FIELDS = (
    (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_SCOPE_ALL_LINKS),
    (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_SCOPE_ALL_LINKS),
)


@dataclass(frozen=True, slots=True)
class CountedGpu:
    """A GPU of this machine to sample: global id, NVML index, NVLink bandwidth (Gbit/s)."""

    gid: int
    index: int
    nvlink_gbps: float = 0.0


@dataclass(frozen=True, slots=True)
class MigSample:
    uuid: str
    memory_used_bytes: int
    memory_total_bytes: int
    gi_id: int | None = None  # its GPU instance's id (dcgm-exporter's GPU_I_ID)


@dataclass(frozen=True, slots=True)
class GpuSample:
    gid: int
    index: int
    utilization: float | None = None  # 0..1
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    pcie_tx_bytes_s: float | None = None
    pcie_rx_bytes_s: float | None = None
    pcie_utilization: float | None = None
    pcie_capacity_bytes_s: float | None = None  # per direction
    nvlink_tx_bytes_s: float | None = None
    nvlink_rx_bytes_s: float | None = None
    nvlink_utilization: float | None = None
    migs: tuple[MigSample, ...] = ()

    def board_fields(self) -> dict[str, object]:
        """What the GPU board keeps of a sample (None removes a field that went unknown)."""
        return {
            "utilization": self.utilization,
            "memory_used_bytes": self.memory_used_bytes,
            "memory_total_bytes": self.memory_total_bytes,
            "pcie_tx_bytes_s": self.pcie_tx_bytes_s,
            "pcie_rx_bytes_s": self.pcie_rx_bytes_s,
            "pcie_utilization": self.pcie_utilization,
            "pcie_capacity_bytes_s": self.pcie_capacity_bytes_s,
            "nvlink_tx_bytes_s": self.nvlink_tx_bytes_s,
            "nvlink_rx_bytes_s": self.nvlink_rx_bytes_s,
            "nvlink_utilization": self.nvlink_utilization,
            "mig_memory": [
                {
                    "uuid": m.uuid,
                    "used_bytes": m.memory_used_bytes,
                    "total_bytes": m.memory_total_bytes,
                    "gi_id": m.gi_id,
                }
                for m in self.migs
            ]
            or None,
        }


class GpuCounters:
    """Reads ``GpuSample``s; keeps the previous NVLink reading of each GPU for its rate."""

    def __init__(
        self,
        api: GpuApi,
        gpus: Sequence[CountedGpu],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.gpus = list(gpus)
        self.clock = clock
        self._nvlink: dict[int, tuple[float, int, int]] = {}  # gid -> (t, tx KiB, rx KiB)
        self._pcie_cap: dict[int, float | None] = {}

    def sample(self) -> list[GpuSample]:
        out = []
        for g in self.gpus:
            try:
                out.append(self._one(g))
            except NvmlError as exc:  # this GPU, this pass: the next pass tries again
                log.debug("GPU %d: counters not read (%s)", g.index, exc)
        return out

    def _one(self, g: CountedGpu) -> GpuSample:
        api = self.api
        h = api.nvmlDeviceGetHandleByIndex(g.index)
        util = maybe(api.nvmlDeviceGetUtilizationRates, h)
        mem = maybe(api.nvmlDeviceGetMemoryInfo, h)
        tx_kb = maybe(api.nvmlDeviceGetPcieThroughput, h, NVML_PCIE_UTIL_TX_BYTES)
        rx_kb = maybe(api.nvmlDeviceGetPcieThroughput, h, NVML_PCIE_UTIL_RX_BYTES)
        tx = None if tx_kb is None else float(tx_kb) * KB
        rx = None if rx_kb is None else float(rx_kb) * KB
        pcie_util = None
        pcie_cap = self._pcie_capacity(g.gid, h)
        if tx is not None and rx is not None:
            pcie_util = duplex_utilization(tx, rx, pcie_cap)
        nv_tx, nv_rx = self._nvlink_rates(g.gid, h)
        nv_util = None
        if nv_tx is not None and nv_rx is not None:
            nv_util = nvlink_utilization(nv_tx, nv_rx, g.nvlink_gbps)
        return GpuSample(
            gid=g.gid,
            index=g.index,
            utilization=None if util is None else int(util.gpu) / 100,
            memory_used_bytes=None if mem is None else int(mem.used),
            memory_total_bytes=None if mem is None else int(mem.total),
            pcie_tx_bytes_s=tx,
            pcie_rx_bytes_s=rx,
            pcie_utilization=pcie_util,
            pcie_capacity_bytes_s=pcie_cap,
            nvlink_tx_bytes_s=nv_tx,
            nvlink_rx_bytes_s=nv_rx,
            nvlink_utilization=nv_util,
            migs=self._migs(h),
        )

    def _pcie_capacity(self, gid: int, h: object) -> float | None:
        if gid not in self._pcie_cap:
            gen = maybe(self.api.nvmlDeviceGetMaxPcieLinkGeneration, h)
            width = maybe(self.api.nvmlDeviceGetMaxPcieLinkWidth, h)
            cap = None if gen is None or width is None else pcie_bytes_per_s(gen, width)
            self._pcie_cap[gid] = cap
        return self._pcie_cap[gid]

    def _nvlink_rates(self, gid: int, h: object) -> tuple[float | None, float | None]:
        values = maybe(self.api.nvmlDeviceGetFieldValues, h, _NVLINK_FIELDS)
        if values is None or len(values) != 2:
            return None, None
        if any(v.nvmlReturn != NVML_SUCCESS for v in values):
            return None, None  # no NVLink on this GPU (a PCIe card), or counters unsupported
        now = self.clock()
        tx_kib, rx_kib = int(values[0].value.ullVal), int(values[1].value.ullVal)
        prev = self._nvlink.get(gid)
        self._nvlink[gid] = (now, tx_kib, rx_kib)
        if prev is None:
            return None, None
        tx = counter_rate((prev[0], prev[1]), (now, tx_kib))
        rx = counter_rate((prev[0], prev[2]), (now, rx_kib))
        return (None if tx is None else tx * KIB), (None if rx is None else rx * KIB)

    def _migs(self, h: object) -> tuple[MigSample, ...]:
        api = self.api
        mode = maybe(api.nvmlDeviceGetMigMode, h)
        if mode is None or int(mode[0]) != NVML_DEVICE_MIG_ENABLE:
            return ()
        out = []
        for k in range(api.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                mig = api.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            except NvmlError as exc:
                if exc.value in (NVML_ERROR_NOT_FOUND, NVML_ERROR_INVALID_ARGUMENT):
                    continue  # an empty slot
                raise
            mem = maybe(api.nvmlDeviceGetMemoryInfo, mig)
            if mem is not None:
                uuid = as_text(api.nvmlDeviceGetUUID(mig))
                gi = maybe(api.nvmlDeviceGetGpuInstanceId, mig)
                gi_id = None if gi is None else int(gi)
                out.append(MigSample(uuid, int(mem.used), int(mem.total), gi_id))
        return tuple(out)
