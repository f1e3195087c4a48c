"""An in-memory NVML for the discovery tests: fake GPUs, MIG instances and NVLink wiring."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufence.control.gpus.discovery import NvmlError
from gpufence.control.gpus.nvml import (
    NVML_ERROR_GPU_NOT_FOUND,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
)
from gpufence.spec import cluster_from_dict

SWITCH = "00000000:c1:00.0"  # an NVSwitch: a remote end that is none of the GPUs


@dataclass(frozen=True)
class Mem:
    total: int


@dataclass(frozen=True)
class Pci:
    busId: str


@dataclass(frozen=True)
class Placement:
    start: int
    size: int


@dataclass(frozen=True)
class GiInfo:
    profileId: int
    placement: Placement


@dataclass(frozen=True)
class Attrs:
    gpuInstanceSliceCount: int
    memorySizeMB: int


@dataclass(frozen=True)
class FakeMig:
    uuid: str
    gi_id: int
    profile_id: int
    start: int
    size: int  # memory slices
    slices: int  # compute slices of the GPU instance
    mem_mb: int
    ci_id: int = 0


@dataclass
class FakeGpu:
    name: str
    memory_mib: int
    bus: str
    mig_mode: tuple[int, int] | None = None  # None: MIG not supported
    migs: list[FakeMig] = field(default_factory=list)
    links: dict[int, str] | None = None  # active link -> remote bus; None: NVLink unsupported
    n_links: int = 12


@dataclass(frozen=True)
class Handle:
    gpu: int
    mig: int | None = None


@dataclass(frozen=True)
class GiHandle:
    gpu: int
    gi_id: int


def err(code: int) -> NvmlError:
    return NvmlError(code, f"NVML error {code}")


class FakeNvml:
    """Implements discovery.NvmlApi over in-memory GPUs."""

    def __init__(
        self,
        gpus: Sequence[FakeGpu],
        *,
        init_error: int | None = None,
        gi_permission: bool = True,
        fail_on: str | None = None,
    ) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.gi_permission = gi_permission
        self.fail_on = fail_on
        self.calls: list[str] = []

    def _gpu(self, h: object) -> FakeGpu:
        assert isinstance(h, Handle)
        return self.gpus[h.gpu]

    def _mig(self, h: object) -> FakeMig:
        assert isinstance(h, Handle) and h.mig is not None
        return self.gpus[h.gpu].migs[h.mig]

    def _log(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_on:
            raise err(NVML_ERROR_GPU_NOT_FOUND)

    def nvmlInit(self) -> None:
        self._log("nvmlInit")
        if self.init_error is not None:
            raise err(self.init_error)

    def nvmlShutdown(self) -> None:
        self._log("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "535.104.05"

    def nvmlSystemGetNVMLVersion(self) -> bytes:
        return b"12.535.104.05"  # some pynvml versions give bytes

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        return Handle(index)

    def nvmlDeviceGetName(self, handle: object) -> bytes:
        return self._gpu(handle).name.encode()

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        if isinstance(handle, Handle) and handle.mig is not None:
            return self._mig(handle).uuid
        return f"GPU-{self._gpu(handle).bus}"

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> Mem:
        self._log("nvmlDeviceGetMemoryInfo")
        return Mem(self._gpu(handle).memory_mib << 20)

    def nvmlDeviceGetPciInfo(self, handle: object) -> Pci:
        return Pci(self._gpu(handle).bus)

    def nvmlDeviceGetMigMode(self, handle: object) -> list[int]:
        mode = self._gpu(handle).mig_mode
        if mode is None:
            raise err(NVML_ERROR_NOT_SUPPORTED)
        return list(mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, index: int) -> Handle:
        assert isinstance(handle, Handle)
        if index >= len(self._gpu(handle).migs):
            raise err(NVML_ERROR_NOT_FOUND)
        return Handle(handle.gpu, index)

    def nvmlDeviceGetGpuInstanceId(self, mig_handle: object) -> int:
        return self._mig(mig_handle).gi_id

    def nvmlDeviceGetComputeInstanceId(self, mig_handle: object) -> int:
        return self._mig(mig_handle).ci_id

    def nvmlDeviceGetMinorNumber(self, handle: object) -> int:
        assert isinstance(handle, Handle)
        return handle.gpu

    def nvmlDeviceGetGpuInstanceById(self, handle: object, gi_id: int) -> GiHandle:
        if not self.gi_permission:
            raise err(NVML_ERROR_NO_PERMISSION)
        assert isinstance(handle, Handle)
        return GiHandle(handle.gpu, gi_id)

    def nvmlGpuInstanceGetInfo(self, gpu_instance: object) -> GiInfo:
        assert isinstance(gpu_instance, GiHandle)
        m = next(m for m in self.gpus[gpu_instance.gpu].migs if m.gi_id == gpu_instance.gi_id)
        return GiInfo(m.profile_id, Placement(m.start, m.size))

    def nvmlDeviceGetAttributes(self, mig_handle: object) -> Attrs:
        m = self._mig(mig_handle)
        return Attrs(m.slices, m.mem_mb)

    def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int:
        g = self._gpu(handle)
        if g.links is None:
            raise err(NVML_ERROR_NOT_SUPPORTED)
        if link >= g.n_links:
            raise err(NVML_ERROR_INVALID_ARGUMENT)
        return 1 if link in g.links else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: object, link: int) -> Pci:
        links = self._gpu(handle).links
        assert links is not None and link in links
        return Pci(links[link])


def bus(i: int) -> str:
    return f"00000000:{0x10 + i:02x}:00.0"


def a100_box() -> list[FakeGpu]:
    """4 x A100-80GB: NVLink pairs 0-1 and 2-3; GPU 3 in MIG mode with two instances."""
    gpus = [FakeGpu("NVIDIA A100-SXM4-80GB", 81920, bus(i), mig_mode=(0, 0)) for i in range(4)]
    # Two links per pair, both directions; the remote bus is spelled without the long domain
    # on one side, as drivers have done.
    gpus[0].links = {0: bus(1), 1: bus(1)}
    gpus[1].links = {0: "0000:10:00.0", 1: bus(0)}
    gpus[2].links = {0: bus(3)}
    gpus[3].links = {0: bus(2)}
    gpus[3].mig_mode = (1, 1)
    gpus[3].migs = [
        FakeMig("MIG-bbbb", gi_id=5, profile_id=14, start=4, size=2, slices=2, mem_mb=19968),
        FakeMig("MIG-aaaa", gi_id=1, profile_id=9, start=0, size=4, slices=3, mem_mb=40192),
    ]
    return gpus


def hgx_h100(n: int = 8) -> list[FakeGpu]:
    """NVSwitch board: every GPU's links end on switches, never on another GPU."""
    return [
        FakeGpu(
            "NVIDIA H100 80GB HBM3",
            81559,
            bus(i),
            mig_mode=(0, 0),
            links={k: SWITCH for k in range(18)},
            n_links=18,
        )
        for i in range(n)
    ]


def load(spec: dict[str, Any]) -> Any:
    return cluster_from_dict(spec, source="discovered GPUs")
