"""An in-memory NVML: fake GPUs, MIG instances (created and destroyed by the real placement
rules), the processes on each GPU, utilisation and NVLink wiring.

``FakeNvml`` implements ``control.gpus.nvml.NvmlApi`` (discovery) and ``GpuApi`` (what the
control plane does on real GPUs), so MIG management, foreign-process detection and idle
detection run in CI without a GPU:

* a GPU instance is created only in MIG mode (else NVML_ERROR_NOT_SUPPORTED), at a placement
  start the profile allows with its exact size (else NVML_ERROR_INVALID_ARGUMENT), and only if
  it overlaps no other instance's memory slices and stays within the profile's and the GPU's
  caps (else NVML_ERROR_INSUFFICIENT_RESOURCES) -- ``gpufence.model.mig`` holds the rules;
* a compute instance fits in what is left of its GPU instance's compute slices; each one is a
  MIG device with a new UUID (as on hardware, where a re-created instance gets a new UUID);
* destroying a GPU instance that still has compute instances, or either while a process runs on
  it, fails with NVML_ERROR_IN_USE;
* ``procs`` are the processes NVML reports on a GPU (a test puts a real pid there);
* the counters the GPU sampler reads (``control/gpus/gpu_counters.py``): ``util`` (percent),
  ``mem_used_mib`` (and ``mig_used_mib`` per MIG UUID), ``pcie_tx_kbs`` / ``pcie_rx_kbs`` (KB/s,
  NVML's unit), the PCIe link's ``pcie_gen`` x ``pcie_width``, and the cumulative NVLink data
  counters ``nvlink_tx_kib`` / ``nvlink_rx_kib`` (KiB since "boot"; ``FakeGpu.send`` moves
  them), each answered through the same NVML call and error codes as on hardware (no NVLink:
  the field's own NVML_ERROR_NOT_SUPPORTED; no utilisation in MIG mode);
* GPU and compute instance IDs as NVML gives them (``nvmlDeviceGetGpuInstanceId`` /
  ``nvmlDeviceGetComputeInstanceId`` of a MIG device); with ``caps`` (``testing/fake_caps.py``)
  the driver's capability files follow every instance created or destroyed, as on hardware;
* ``fail_next(name, code, after=n)`` makes a later call of ``name`` fail with ``code`` (e.g. an
  NVML error mid-reconfigure); ``root=False`` refuses every MIG change with NO_PERMISSION.

``FakeMig`` entries are MIG devices (one compute instance each); a GPU instance without a
compute instance is kept in ``FakeGpu.bare_gis``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufence.control.gpus.discovery import NvmlError
from gpufence.control.gpus.nvml import (
    NVML_CI_PROFILE_BY_SLICES,
    NVML_ERROR_GPU_NOT_FOUND,
    NVML_ERROR_IN_USE,
    NVML_ERROR_INSUFFICIENT_RESOURCES,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNKNOWN,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    NVML_NO_INSTANCE_ID,
    NVML_PCIE_UTIL_RX_BYTES,
    NVML_PCIE_UTIL_TX_BYTES,
    NVML_SCOPE_ALL_LINKS,
    NVML_SUCCESS,
    GpuInstancePlacement,
    catalogue_type,
)
from gpufence.model import mig as migmod
from gpufence.spec import cluster_from_dict
from gpufence.spec.catalogue import CATALOGUE
from gpufence.testing.fake_caps import FakeCaps

SWITCH = "00000000:c1:00.0"  # an NVSwitch: a remote end that is none of the GPUs
_SLICES_BY_CI_PROFILE = {v: k for k, v in NVML_CI_PROFILE_BY_SLICES.items()}


@dataclass(frozen=True)
class Mem:
    total: int
    used: int = 0


@dataclass(frozen=True)
class FieldNumber:
    ullVal: int = 0


@dataclass(frozen=True)
class Field:
    """``nvmlFieldValue_t``: each field has its own return code."""

    fieldId: int
    scopeId: int
    nvmlReturn: int
    value: FieldNumber = FieldNumber()


@dataclass(frozen=True)
class Pci:
    busId: str


@dataclass(frozen=True)
class Placement:
    start: int
    size: int


@dataclass(frozen=True)
class GiInfo:
    id: int
    profileId: int
    placement: Placement


@dataclass(frozen=True)
class Attrs:
    gpuInstanceSliceCount: int
    memorySizeMB: int


@dataclass(frozen=True)
class CiProfile:
    id: int


@dataclass(frozen=True)
class Util:
    gpu: int
    memory: int = 0


@dataclass(frozen=True)
class FakeMig:
    """A MIG device: one compute instance of GPU instance ``gi_id``."""

    uuid: str
    gi_id: int
    profile_id: int
    start: int
    size: int  # memory slices
    slices: int  # compute slices of the GPU instance
    mem_mb: int
    ci_id: int = 0


@dataclass(frozen=True)
class FakeGi:
    gi_id: int
    profile_id: int
    start: int
    size: int


@dataclass(frozen=True)
class FakeProc:
    """A process NVML reports on a GPU (``nvmlProcessInfo_t``)."""

    pid: int
    usedGpuMemory: int | None = 1 << 30
    gpuInstanceId: int = NVML_NO_INSTANCE_ID
    computeInstanceId: int = NVML_NO_INSTANCE_ID


@dataclass
class FakeGpu:
    name: str
    memory_mib: int
    bus: str
    mig_mode: tuple[int, int] | None = None  # (current, pending); None: MIG not supported
    migs: list[FakeMig] = field(default_factory=list)
    links: dict[int, str] | None = None  # active link -> remote bus; None: NVLink unsupported
    n_links: int = 12
    bare_gis: list[FakeGi] = field(default_factory=list)  # GPU instances without a CI
    procs: list[FakeProc] = field(default_factory=list)
    util: int = 0  # percent
    mem_used_mib: int = 0
    mig_used_mib: dict[str, int] = field(default_factory=dict)  # MIG UUID -> MiB used
    pcie_tx_kbs: int = 0  # KB/s, as nvmlDeviceGetPcieThroughput answers
    pcie_rx_kbs: int = 0
    pcie_gen: int = 5
    pcie_width: int = 16
    nvlink_tx_kib: int = 0  # cumulative, as the NVLink throughput fields are
    nvlink_rx_kib: int = 0

    def send(self, tx_bytes: float, rx_bytes: float = 0.0) -> None:
        """NVLink traffic: move the cumulative counters (whole KiB, as NVML counts)."""
        self.nvlink_tx_kib += int(tx_bytes) // 1024
        self.nvlink_rx_kib += int(rx_bytes) // 1024

    def gpu_instances(self) -> list[FakeGi]:
        seen: dict[int, FakeGi] = {g.gi_id: g for g in self.bare_gis}
        for m in self.migs:
            seen.setdefault(m.gi_id, FakeGi(m.gi_id, m.profile_id, m.start, m.size))
        return sorted(seen.values(), key=lambda g: g.gi_id)

    def layout(self) -> list[str]:
        """ "profile@start" of every GPU instance (catalogue names), for test assertions."""
        profiles = _profiles(self)
        by_id = {p.gi_profile_id: p.name for p in profiles.values()}
        return sorted(f"{by_id[g.profile_id]}@{g.start}" for g in self.gpu_instances())


@dataclass(frozen=True)
class Handle:
    gpu: int
    mig: int | None = None


@dataclass(frozen=True)
class GiHandle:
    gpu: int
    gi_id: int


@dataclass(frozen=True)
class CiHandle:
    gpu: int
    gi_id: int
    ci_id: int


def err(code: int) -> NvmlError:
    return NvmlError(code, f"NVML error {code}")


def _profiles(g: FakeGpu) -> dict[str, migmod.MigProfile]:
    t = catalogue_type(g.name, g.memory_mib)
    model = CATALOGUE[t].mig_model if t is not None else None
    if model is None:
        raise err(NVML_ERROR_NOT_SUPPORTED)
    return dict(migmod.profiles_for(model))


class FakeNvml:
    """Implements NvmlApi and GpuApi over in-memory GPUs (see the module docstring)."""

    def __init__(
        self,
        gpus: Sequence[FakeGpu],
        *,
        init_error: int | None = None,
        gi_permission: bool = True,
        fail_on: str | None = None,
        root: bool = True,
        caps: FakeCaps | None = None,
    ) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.gi_permission = gi_permission
        self.fail_on = fail_on
        self.root = root
        self.calls: list[str] = []
        self.faults: dict[str, list[int]] = {}
        self._serial = itertools.count(1)
        self.caps = caps
        self._sync_caps()

    def fail_next(
        self, name: str, code: int = NVML_ERROR_UNKNOWN, times: int = 1, after: int = 0
    ) -> None:
        """After ``after`` more calls of ``name`` that succeed, ``times`` calls fail with
        ``code``."""
        self.faults.setdefault(name, []).extend([0] * after + [code] * times)

    def _gpu(self, h: object) -> FakeGpu:
        assert isinstance(h, Handle | GiHandle | CiHandle)
        return self.gpus[h.gpu]

    def _mig(self, h: object) -> FakeMig:
        assert isinstance(h, Handle) and h.mig is not None
        return self.gpus[h.gpu].migs[h.mig]

    def _log(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_on:
            raise err(NVML_ERROR_GPU_NOT_FOUND)
        queued = self.faults.get(name)
        if queued:
            code = queued.pop(0)
            if code:
                raise err(code)

    def _change(self, name: str) -> None:
        self._log(name)
        if not self.root:
            raise err(NVML_ERROR_NO_PERMISSION)

    # -- discovery (NvmlApi) -------------------------------------------------------------------
    def _sync_caps(self) -> None:
        """The capability files of every instance now (a test may have set ``migs``)."""
        if self.caps is not None:
            self.caps.sync(
                [(i, x.gi_id, None) for i, g in enumerate(self.gpus) for x in g.gpu_instances()]
                + [(i, m.gi_id, m.ci_id) for i, g in enumerate(self.gpus) for m in g.migs]
            )

    def nvmlInit(self) -> None:
        self._log("nvmlInit")
        self._sync_caps()
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
        if not 0 <= index < len(self.gpus):
            raise err(NVML_ERROR_INVALID_ARGUMENT)
        return Handle(index)

    def nvmlDeviceGetName(self, handle: object) -> bytes:
        return self._gpu(handle).name.encode()

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        if isinstance(handle, Handle) and handle.mig is not None:
            return self._mig(handle).uuid
        return f"GPU-{self._gpu(handle).bus}"

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> Mem:
        self._log("nvmlDeviceGetMemoryInfo")
        g = self._gpu(handle)
        if isinstance(handle, Handle) and handle.mig is not None:
            m = self._mig(handle)
            return Mem(m.mem_mb << 20, g.mig_used_mib.get(m.uuid, 0) << 20)
        return Mem(g.memory_mib << 20, g.mem_used_mib << 20)

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
        if all(g.gi_id != gi_id for g in self._gpu(handle).gpu_instances()):
            raise err(NVML_ERROR_NOT_FOUND)
        return GiHandle(handle.gpu, gi_id)

    def nvmlGpuInstanceGetInfo(self, gpu_instance: object) -> GiInfo:
        gi = self._gi(gpu_instance)
        return GiInfo(gi.gi_id, gi.profile_id, Placement(gi.start, gi.size))

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

    # -- processes and utilisation (GpuApi) ----------------------------------------------------
    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[FakeProc]:
        self._log("nvmlDeviceGetComputeRunningProcesses")
        g = self._gpu(handle)
        if isinstance(handle, Handle) and handle.mig is not None:
            gi = self._mig(handle).gi_id
            return [p for p in g.procs if p.gpuInstanceId == gi]
        return list(g.procs)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Util:
        self._log("nvmlDeviceGetUtilizationRates")
        g = self._gpu(handle)
        if g.mig_mode is not None and g.mig_mode[0] == 1:
            raise err(NVML_ERROR_NOT_SUPPORTED)  # no per-GPU utilisation in MIG mode
        return Util(g.util)

    def nvmlDeviceGetPcieThroughput(self, handle: object, counter: int) -> int:
        self._log("nvmlDeviceGetPcieThroughput")
        g = self._gpu(handle)
        if counter == NVML_PCIE_UTIL_TX_BYTES:
            return g.pcie_tx_kbs
        if counter == NVML_PCIE_UTIL_RX_BYTES:
            return g.pcie_rx_kbs
        raise err(NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: object) -> int:
        return self._gpu(handle).pcie_gen

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: object) -> int:
        return self._gpu(handle).pcie_width

    def nvmlDeviceGetFieldValues(
        self, handle: object, field_ids: Sequence[tuple[int, int]]
    ) -> list[Field]:
        self._log("nvmlDeviceGetFieldValues")
        g = self._gpu(handle)
        counters = {
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: g.nvlink_tx_kib,
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: g.nvlink_rx_kib,
        }
        out = []
        for fid, scope in field_ids:
            if fid not in counters or g.links is None:
                out.append(Field(fid, scope, NVML_ERROR_NOT_SUPPORTED))
            elif scope != NVML_SCOPE_ALL_LINKS and scope >= g.n_links:
                out.append(Field(fid, scope, NVML_ERROR_INVALID_ARGUMENT))
            else:  # one link's share: the fake spreads traffic evenly over its links
                total = counters[fid]
                value = total if scope == NVML_SCOPE_ALL_LINKS else total // g.n_links
                out.append(Field(fid, scope, NVML_SUCCESS, FieldNumber(value)))
        return out

    # -- MIG instances (GpuApi) ----------------------------------------------------------------
    def _gi(self, h: object) -> FakeGi:
        assert isinstance(h, GiHandle | CiHandle)
        for gi in self.gpus[h.gpu].gpu_instances():
            if gi.gi_id == h.gi_id:
                return gi
        raise err(NVML_ERROR_INVALID_ARGUMENT)  # a handle of a destroyed instance

    def _mig_on(self, g: FakeGpu) -> None:
        if g.mig_mode is None or g.mig_mode[0] != 1:
            raise err(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetGpuInstances(self, handle: object, profile_id: int) -> list[GiHandle]:
        self._log("nvmlDeviceGetGpuInstances")
        assert isinstance(handle, Handle)
        g = self._gpu(handle)
        self._mig_on(g)
        if all(p.gi_profile_id != profile_id for p in _profiles(g).values()):
            raise err(NVML_ERROR_INVALID_ARGUMENT)
        return [
            GiHandle(handle.gpu, x.gi_id) for x in g.gpu_instances() if x.profile_id == profile_id
        ]

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: object, profile_id: int, placement: GpuInstancePlacement
    ) -> GiHandle:
        self._change("nvmlDeviceCreateGpuInstanceWithPlacement")
        assert isinstance(handle, Handle)
        g = self._gpu(handle)
        self._mig_on(g)
        profiles = _profiles(g)
        by_id = {p.gi_profile_id: p for p in profiles.values()}
        p = by_id.get(profile_id)
        if p is None or placement.start not in p.starts or placement.size != p.mem_slices:
            raise err(NVML_ERROR_INVALID_ARGUMENT)
        current = [migmod.MigInstance(by_id[x.profile_id].name, x.start) for x in g.gpu_instances()]
        if not migmod.can_place(profiles, current, p.name, placement.start):
            raise err(NVML_ERROR_INSUFFICIENT_RESOURCES)
        used = {x.gi_id for x in g.gpu_instances()}
        gi_id = next(i for i in itertools.count(1) if i not in used)
        g.bare_gis.append(FakeGi(gi_id, profile_id, placement.start, placement.size))
        self._sync_caps()
        return GiHandle(handle.gpu, gi_id)

    def nvmlGpuInstanceDestroy(self, gpu_instance: object) -> None:
        self._change("nvmlGpuInstanceDestroy")
        gi = self._gi(gpu_instance)
        g = self._gpu(gpu_instance)
        busy = any(p.gpuInstanceId == gi.gi_id for p in g.procs)
        if busy or any(m.gi_id == gi.gi_id for m in g.migs):
            raise err(NVML_ERROR_IN_USE)
        g.bare_gis = [x for x in g.bare_gis if x.gi_id != gi.gi_id]
        self._sync_caps()

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpu_instance: object, profile: int, eng_profile: int
    ) -> CiProfile:
        gi = self._gi(gpu_instance)
        slices = _SLICES_BY_CI_PROFILE.get(profile)
        by_id = {p.gi_profile_id: p for p in _profiles(self._gpu(gpu_instance)).values()}
        if slices is None or slices > by_id[gi.profile_id].compute_slices:
            raise err(NVML_ERROR_NOT_SUPPORTED)
        return CiProfile(profile)

    def nvmlGpuInstanceCreateComputeInstance(
        self, gpu_instance: object, profile_id: int
    ) -> CiHandle:
        self._change("nvmlGpuInstanceCreateComputeInstance")
        gi = self._gi(gpu_instance)
        g = self._gpu(gpu_instance)
        p = next(x for x in _profiles(g).values() if x.gi_profile_id == gi.profile_id)
        slices = _SLICES_BY_CI_PROFILE.get(profile_id)
        if slices is None:
            raise err(NVML_ERROR_INVALID_ARGUMENT)
        taken = sum(m.slices for m in g.migs if m.gi_id == gi.gi_id)
        if taken + slices > p.compute_slices:
            raise err(NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = next(
            i for i in itertools.count() if all(m.ci_id != i for m in g.migs if m.gi_id == gi.gi_id)
        )
        uuid = f"MIG-fake{next(self._serial):04d}-{g.bus[-7:-5]}{gi.gi_id:02d}-{ci_id:02d}"
        mem = round(p.memory_gib * 1024)
        g.migs.append(FakeMig(uuid, gi.gi_id, gi.profile_id, gi.start, gi.size, slices, mem, ci_id))
        self._sync_caps()
        return CiHandle(self.gpus.index(g), gi.gi_id, ci_id)

    def nvmlGpuInstanceGetComputeInstances(
        self, gpu_instance: object, profile_id: int
    ) -> list[CiHandle]:
        gi = self._gi(gpu_instance)
        assert isinstance(gpu_instance, GiHandle)
        slices = _SLICES_BY_CI_PROFILE.get(profile_id)
        return [
            CiHandle(gpu_instance.gpu, gi.gi_id, m.ci_id)
            for m in self._gpu(gpu_instance).migs
            if m.gi_id == gi.gi_id and m.slices == slices
        ]

    def nvmlComputeInstanceDestroy(self, compute_instance: object) -> None:
        self._change("nvmlComputeInstanceDestroy")
        assert isinstance(compute_instance, CiHandle)
        g = self._gpu(compute_instance)
        h = compute_instance
        if any(p.gpuInstanceId == h.gi_id and p.computeInstanceId == h.ci_id for p in g.procs):
            raise err(NVML_ERROR_IN_USE)
        gone = [m for m in g.migs if m.gi_id == h.gi_id and m.ci_id == h.ci_id]
        if not gone:
            raise err(NVML_ERROR_INVALID_ARGUMENT)
        g.migs = [m for m in g.migs if m not in gone]
        if all(m.gi_id != h.gi_id for m in g.migs) and all(x.gi_id != h.gi_id for x in g.bare_gis):
            m = gone[0]
            g.bare_gis.append(FakeGi(m.gi_id, m.profile_id, m.start, m.size))
        self._sync_caps()


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


def hgx_h100(n: int = 8, mig: int = 0) -> list[FakeGpu]:
    """NVSwitch board: every GPU's links end on switches, never on another GPU. The first
    ``mig`` GPUs are in MIG mode with no instances yet."""
    return [
        FakeGpu(
            "NVIDIA H100 80GB HBM3",
            81559,
            bus(i),
            mig_mode=(1, 1) if i < mig else (0, 0),
            links={k: SWITCH for k in range(18)},
            n_links=18,
        )
        for i in range(n)
    ]


def load(spec: dict[str, Any]) -> Any:
    return cluster_from_dict(spec, source="discovered GPUs")
