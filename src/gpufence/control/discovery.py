"""This machine's GPUs, found through NVML (or made up with --fake-gpus), as a one-node spec.

``discover()`` asks NVML (the ``nvidia-ml-py`` package, module ``pynvml``, imported on first use)
for every GPU: name, UUID, memory, MIG mode and instances (profile + placement start), and the
GPUs each one reaches over NVLink. ``fake_gpus()`` makes the same description without hardware.
``node_spec()`` turns either into a cluster-spec dict (the format of ``gpufence.spec``) for one
node, which ``gpufence.spec.cluster_from_dict`` loads.

Every NVML call goes through ``NvmlApi``, so the logic runs against an in-memory fake in tests.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from gpufence.model.hardware import GpuType
from gpufence.model.job import WorkloadClass
from gpufence.model.mig import MIG_CATALOGUE, MigProfile
from gpufence.spec.catalogue import CATALOGUE, builtin_gpu_types, mig_layout_problems
from gpufence.spec.errors import name_list, number_ranges, suggest
from gpufence.spec.schema import NAME_RE

__all__ = [
    "DiscoveredGpu",
    "Discovery",
    "DiscoveryError",
    "MigDevice",
    "NvmlApi",
    "NvmlError",
    "PynvmlApi",
    "catalogue_type",
    "discover",
    "fake_gpus",
    "node_spec",
    "spec_gpu_type",
]

# NVML return codes and constants (nvml.h; the same values pynvml exports).
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_DEVICE_MIG_ENABLE = 1
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 36  # nvml.h; H100/H200 use 18, A100 12, V100 6 (the rest: not found)

# "This GPU / driver cannot tell": the answer is unknown, not an error of the machine.
_UNAVAILABLE = frozenset(
    {
        NVML_ERROR_NOT_SUPPORTED,
        NVML_ERROR_NO_PERMISSION,
        NVML_ERROR_FUNCTION_NOT_FOUND,
        NVML_ERROR_INVALID_ARGUMENT,
        NVML_ERROR_NOT_FOUND,
    }
)

_NO_GPU_HINT = (
    "use --fake-gpus N to run gpufence without GPUs, or --config FILE to describe the cluster"
)
_MIB = 1 << 20


class DiscoveryError(RuntimeError):
    """No GPU could be discovered, or the discovered GPUs cannot be described as one node."""


class NvmlError(Exception):
    """An NVML call failed; ``value`` is the NVML return code (NVML_ERROR_*)."""

    def __init__(self, value: int, message: str | None = None) -> None:
        super().__init__(message or f"NVML error {value}")
        self.value = value


# -- the NVML surface ------------------------------------------------------------------------
# Structs are read by attribute, exactly as pynvml's ctypes structs are; strings may come back
# as bytes from some pynvml versions. Handles are opaque.


class MemoryInfo(Protocol):
    @property
    def total(self) -> int: ...


class PciInfo(Protocol):
    @property
    def busId(self) -> str | bytes: ...


class GpuInstancePlacement(Protocol):
    @property
    def start(self) -> int: ...

    @property
    def size(self) -> int: ...


class GpuInstanceInfo(Protocol):
    @property
    def profileId(self) -> int: ...

    @property
    def placement(self) -> GpuInstancePlacement: ...


class DeviceAttributes(Protocol):
    @property
    def gpuInstanceSliceCount(self) -> int: ...

    @property
    def memorySizeMB(self) -> int: ...


class NvmlApi(Protocol):
    """The pynvml calls discovery makes; each raises NvmlError when NVML returns an error."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlSystemGetNVMLVersion(self) -> str | bytes: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object: ...
    def nvmlDeviceGetName(self, handle: object) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object) -> MemoryInfo: ...
    def nvmlDeviceGetPciInfo(self, handle: object) -> PciInfo: ...
    def nvmlDeviceGetMigMode(self, handle: object) -> Sequence[int]: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, index: int) -> object: ...
    def nvmlDeviceGetGpuInstanceId(self, mig_handle: object) -> int: ...
    def nvmlDeviceGetGpuInstanceById(self, handle: object, gi_id: int) -> object: ...
    def nvmlGpuInstanceGetInfo(self, gpu_instance: object) -> GpuInstanceInfo: ...
    def nvmlDeviceGetAttributes(self, mig_handle: object) -> DeviceAttributes: ...
    def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int: ...
    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: object, link: int) -> PciInfo: ...


class PynvmlApi:
    """NvmlApi over the ``pynvml`` module of nvidia-ml-py, imported when this is created."""

    def __init__(self) -> None:
        try:
            self._nv: Any = importlib.import_module("pynvml")
        except ImportError as exc:
            raise DiscoveryError(
                "cannot discover GPUs: the NVML bindings are not installed "
                f"(pip install nvidia-ml-py); {_NO_GPU_HINT}"
            ) from exc

    def _call(self, name: str, *args: object) -> Any:
        try:
            return getattr(self._nv, name)(*args)
        except self._nv.NVMLError as exc:
            raise NvmlError(int(exc.value), str(exc)) from exc

    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        return cast("str | bytes", self._call("nvmlSystemGetDriverVersion"))

    def nvmlSystemGetNVMLVersion(self) -> str | bytes:
        return cast("str | bytes", self._call("nvmlSystemGetNVMLVersion"))

    def nvmlDeviceGetCount(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    def nvmlDeviceGetName(self, handle: object) -> str | bytes:
        return cast("str | bytes", self._call("nvmlDeviceGetName", handle))

    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes:
        return cast("str | bytes", self._call("nvmlDeviceGetUUID", handle))

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> MemoryInfo:
        return cast("MemoryInfo", self._call("nvmlDeviceGetMemoryInfo", handle))

    def nvmlDeviceGetPciInfo(self, handle: object) -> PciInfo:
        return cast("PciInfo", self._call("nvmlDeviceGetPciInfo", handle))

    def nvmlDeviceGetMigMode(self, handle: object) -> Sequence[int]:
        return cast("Sequence[int]", self._call("nvmlDeviceGetMigMode", handle))

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object) -> int:
        return int(self._call("nvmlDeviceGetMaxMigDeviceCount", handle))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, index: int) -> object:
        return self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, index)

    def nvmlDeviceGetGpuInstanceId(self, mig_handle: object) -> int:
        return int(self._call("nvmlDeviceGetGpuInstanceId", mig_handle))

    def nvmlDeviceGetGpuInstanceById(self, handle: object, gi_id: int) -> object:
        return self._call("nvmlDeviceGetGpuInstanceById", handle, gi_id)

    def nvmlGpuInstanceGetInfo(self, gpu_instance: object) -> GpuInstanceInfo:
        return cast("GpuInstanceInfo", self._call("nvmlGpuInstanceGetInfo", gpu_instance))

    def nvmlDeviceGetAttributes(self, mig_handle: object) -> DeviceAttributes:
        return cast("DeviceAttributes", self._call("nvmlDeviceGetAttributes", mig_handle))

    def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int:
        return int(self._call("nvmlDeviceGetNvLinkState", handle, link))

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: object, link: int) -> PciInfo:
        return cast("PciInfo", self._call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link))


# -- results -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigDevice:
    uuid: str  # "MIG-..." (what CUDA_VISIBLE_DEVICES names)
    profile: str  # GPU-instance profile in catalogue naming, e.g. "3g.40gb"
    start: int | None  # placement start (memory slice); None where NVML would not say


@dataclass(frozen=True, slots=True)
class DiscoveredGpu:
    index: int  # NVML index (PCI bus order)
    uuid: str
    model: str  # NVML name, e.g. "NVIDIA H100 80GB HBM3"
    gpu_type: str | None  # gpufence catalogue type, e.g. "H100-80GB"; None if not in it
    memory_mib: int
    mig_enabled: bool
    mig_devices: tuple[MigDevice, ...]
    nvlink_peers: tuple[int, ...]  # GPUs reached over an active NVLink (directly or via NVSwitch)
    nvlink_reported: bool = True  # False: NVML gave no NVLink state, so peers are unknown


@dataclass(frozen=True, slots=True)
class Discovery:
    gpus: tuple[DiscoveredGpu, ...]
    fake: bool
    driver: str | None
    source: str  # one sentence for logs and `status`


# -- NVML name -> catalogue type ---------------------------------------------------------------

# (pattern on the NVML name, candidate catalogue types). "A10" must not match "A100" or "A10G",
# and "H100 NVL" (94 GB) must not pass for H100-80GB: the memory check below settles that.
_FAMILIES: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = (
    (re.compile(r"\bH200\b"), ("H200-141GB",)),
    (re.compile(r"\bH100\b"), ("H100-80GB",)),
    (re.compile(r"\bA100\b"), ("A100-40GB", "A100-80GB")),
    (re.compile(r"\bV100S?\b"), ("V100-32GB",)),
    (re.compile(r"\bL40S\b"), ("L40S-48GB",)),
    (re.compile(r"\bA10\b"), ("A10-24GB",)),
    (re.compile(r"\bT4\b"), ("T4-16GB",)),
)
# NVML reports less than the marketed size (ECC, reserved memory): an L40S "48GB" shows 45 GiB,
# a T4 with ECC 14.75 GiB, an H100 80GB 79.6 GiB. 12% keeps 40 vs 80 GB and H100 NVL apart.
_MEMORY_TOLERANCE = 0.12


def catalogue_type(model: str, memory_mib: int) -> str | None:
    """The catalogue GPU type of an NVML device name and total memory, or None if unknown."""
    gib = memory_mib / 1024
    for pattern, candidates in _FAMILIES:
        if pattern.search(model.upper()):
            fits = [
                CATALOGUE[c]
                for c in candidates
                if abs(gib - CATALOGUE[c].memory_gib) <= _MEMORY_TOLERANCE * CATALOGUE[c].memory_gib
            ]
            if not fits:
                return None
            return min(fits, key=lambda t: abs(gib - t.memory_gib)).name
    return None


def _custom_type(gpu: DiscoveredGpu) -> GpuType:
    """A spec-declared type for a GPU outside the catalogue, named after its NVML name."""
    gib = round(gpu.memory_mib / 1024)
    base = re.sub(r"^(NVIDIA|Tesla)\s+", "", gpu.model.strip(), flags=re.IGNORECASE)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-._") or "GPU"
    if not re.search(r"\d+GB$", name, flags=re.IGNORECASE):
        name += f"-{gib}GB"
    if name in CATALOGUE:
        name = f"local-{name}"
    return GpuType(name, max(round(gpu.memory_mib / 1024, 1), 0.1))


def spec_gpu_type(gpu: DiscoveredGpu) -> str:
    """The gpu_type node_spec() gives this GPU: its catalogue type, else a declared custom one."""
    return gpu.gpu_type if gpu.gpu_type is not None else _custom_type(gpu).name


# -- discovery ---------------------------------------------------------------------------------


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


T = TypeVar("T")


def _maybe(call: Callable[..., T], *args: object) -> T | None:
    """The call's answer, or None where NVML cannot tell (not supported, no permission...)."""
    try:
        return call(*args)
    except NvmlError as exc:
        if exc.value in _UNAVAILABLE:
            return None
        raise


_BUS_RE = re.compile(r"^(?:([0-9a-f]+):)?([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+)$")


def _bus_key(pci: PciInfo) -> str:
    """A PCI bus ID in one spelling ("00000000:07:00.0" and "0000:07:00.0" are one device)."""
    text = _text(pci.busId).strip().lower()
    m = _BUS_RE.match(text)
    if m is None:
        return text
    domain, bus, dev, fn = (int(g, 16) if g else 0 for g in m.groups())
    return f"{domain:08x}:{bus:02x}:{dev:02x}.{fn:x}"


def _init_failure(exc: NvmlError) -> str:
    why = {
        NVML_ERROR_LIBRARY_NOT_FOUND: (
            "the NVML library (libnvidia-ml.so.1) was not found: the NVIDIA driver is not "
            "installed on this machine"
        ),
        NVML_ERROR_DRIVER_NOT_LOADED: (
            "the NVIDIA driver is not loaded (does `nvidia-smi` work? in a container, is the "
            "GPU passed in?)"
        ),
        NVML_ERROR_NO_PERMISSION: "no permission to open the GPU devices (/dev/nvidia*)",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
            "the NVML library and the loaded kernel driver have different versions "
            "(reboot or reload the driver after an upgrade)"
        ),
    }.get(exc.value, f"NVML did not start ({exc})")
    return f"cannot discover GPUs: {why}; {_NO_GPU_HINT}"


def _mig_profile_name(
    profiles: Mapping[str, MigProfile] | None,
    profile_id: int | None,
    size: int | None,
    slices: int | None,
    mem_mb: int | None,
) -> str | None:
    """Catalogue name of a GPU instance from what NVML told about it (None if too little)."""
    if profiles:
        if profile_id is not None:
            for p in profiles.values():
                if (
                    p.gi_profile_id == profile_id
                    and size in (None, 0, p.mem_slices)
                    and slices in (None, p.compute_slices)
                ):
                    return p.name
        if slices is not None and mem_mb is not None:
            # No profile ID (not permitted): compute slices and memory pick the profile; the
            # +me variant looks the same as the plain one from here, so the plain one is taken.
            fits = [
                p
                for p in profiles.values()
                if p.compute_slices == slices and size in (None, 0, p.mem_slices)
            ]
            if fits:
                return min(
                    fits, key=lambda p: (abs(p.memory_gib * 1024 - mem_mb), p.media_ext)
                ).name
    if slices is not None and mem_mb is not None:
        return f"{slices}g.{round(mem_mb / 1024)}gb"  # not a catalogue model: NVIDIA-style name
    return None


def _mig_devices(
    api: NvmlApi, index: int, handle: object, gpu_type: str | None
) -> tuple[MigDevice, ...]:
    model = CATALOGUE[gpu_type].mig_model if gpu_type is not None else None
    profiles = MIG_CATALOGUE.get(model) if model else None
    out: list[MigDevice] = []
    for k in range(api.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = api.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)
        except NvmlError as exc:
            if exc.value in (NVML_ERROR_NOT_FOUND, NVML_ERROR_INVALID_ARGUMENT):
                continue  # an empty slot
            raise
        uuid = _text(api.nvmlDeviceGetUUID(mig))
        # The GPU-instance handle needs a privileged user on some drivers; the MIG device's
        # attributes do not, but give no placement.
        gi_id = _maybe(api.nvmlDeviceGetGpuInstanceId, mig)
        gi = None if gi_id is None else _maybe(api.nvmlDeviceGetGpuInstanceById, handle, gi_id)
        info = None if gi is None else _maybe(api.nvmlGpuInstanceGetInfo, gi)
        attrs = _maybe(api.nvmlDeviceGetAttributes, mig)
        name = _mig_profile_name(
            profiles,
            None if info is None else int(info.profileId),
            None if info is None else int(info.placement.size),
            None if attrs is None else int(attrs.gpuInstanceSliceCount),
            None if attrs is None else int(attrs.memorySizeMB),
        )
        if name is None:
            raise DiscoveryError(
                f"GPU {index}: NVML does not tell the profile of MIG device {uuid} "
                "(run discovery as root, or describe the GPUs with --config FILE)"
            )
        start = None if info is None else int(info.placement.start)
        out.append(MigDevice(uuid, name, start))
    return tuple(sorted(out, key=lambda m: (m.start is None, m.start or 0, m.profile, m.uuid)))


def _nvlink_remotes(api: NvmlApi, handle: object) -> tuple[bool, list[str | None]]:
    """(whether NVML reported any link state, remote bus IDs of active links; None: unknown)."""
    reported = False
    remotes: list[str | None] = []
    for link in range(NVML_NVLINK_MAX_LINKS):
        state = _maybe(api.nvmlDeviceGetNvLinkState, handle, link)
        if state is None:
            continue  # no such link, or no NVLink on this GPU (PCIe card), or cannot say
        reported = True
        if state == NVML_FEATURE_ENABLED:
            pci = _maybe(api.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            remotes.append(None if pci is None else _bus_key(pci))
    return reported, remotes


def _nvlink_peers(
    buses: Sequence[str | None], remotes: Sequence[Sequence[str | None]]
) -> list[set[int]]:
    """Peers per GPU: direct GPU-GPU links both ways, and all GPUs on the NVSwitch fabric.

    A remote end that is not one of this machine's GPUs is taken to be an NVSwitch (HGX
    boards): every GPU with an active link to one reaches every other such GPU. An active link
    whose remote end NVML does not name (None) is counted the same way.
    """
    by_bus = {b: i for i, b in enumerate(buses) if b is not None}
    peers: list[set[int]] = [set() for _ in buses]
    on_switch: set[int] = set()
    for i, ends in enumerate(remotes):
        for end in ends:
            j = by_bus.get(end) if end is not None else None
            if j is None:
                on_switch.add(i)
            elif j != i:
                peers[i].add(j)
                peers[j].add(i)
    for i in on_switch:
        peers[i] |= on_switch - {i}
    return peers


def discover(nvml: NvmlApi | None = None) -> Discovery:
    """This machine's GPUs as NVML reports them; DiscoveryError says why there are none."""
    api: NvmlApi = nvml if nvml is not None else PynvmlApi()
    try:
        api.nvmlInit()
    except NvmlError as exc:
        raise DiscoveryError(_init_failure(exc)) from exc
    try:
        return _discover(api)
    except NvmlError as exc:
        raise DiscoveryError(f"GPU discovery failed: NVML: {exc}") from exc
    finally:
        with contextlib.suppress(NvmlError):
            api.nvmlShutdown()


def _discover(api: NvmlApi) -> Discovery:
    driver = _text(api.nvmlSystemGetDriverVersion())
    nvml_version = _maybe(api.nvmlSystemGetNVMLVersion)
    count = api.nvmlDeviceGetCount()
    if count < 1:
        raise DiscoveryError(
            f"cannot discover GPUs: NVML (driver {driver}) sees no GPU on this machine "
            f"(check CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES); {_NO_GPU_HINT}"
        )
    rows: list[tuple[int, str, str, str | None, int, bool, tuple[MigDevice, ...]]] = []
    buses: list[str | None] = []
    remotes: list[list[str | None]] = []
    reported: list[bool] = []
    for i in range(count):
        try:
            handle = api.nvmlDeviceGetHandleByIndex(i)
            model = _text(api.nvmlDeviceGetName(handle)).strip()
            uuid = _text(api.nvmlDeviceGetUUID(handle))
            memory_mib = int(api.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
            gpu_type = catalogue_type(model, memory_mib)
            mode = _maybe(api.nvmlDeviceGetMigMode, handle)
            mig_enabled = mode is not None and int(mode[0]) == NVML_DEVICE_MIG_ENABLE
            migs = _mig_devices(api, i, handle, gpu_type) if mig_enabled else ()
            pci = _maybe(api.nvmlDeviceGetPciInfo, handle)
            has_links, ends = _nvlink_remotes(api, handle)
        except NvmlError as exc:
            raise DiscoveryError(f"GPU discovery failed on GPU {i}: NVML: {exc}") from exc
        rows.append((i, uuid, model, gpu_type, memory_mib, mig_enabled, migs))
        buses.append(None if pci is None else _bus_key(pci))
        remotes.append(ends)
        reported.append(has_links)
    peers = _nvlink_peers(buses, remotes)
    gpus = tuple(
        DiscoveredGpu(*row, nvlink_peers=tuple(sorted(peers[k])), nvlink_reported=reported[k])
        for k, row in enumerate(rows)
    )
    version = _text(nvml_version) if nvml_version is not None else None
    head = f"NVML {version} (driver {driver})" if version else f"NVIDIA driver {driver}"
    return Discovery(gpus, fake=False, driver=driver, source=f"{head}: {_summary(gpus)}")


def _summary(gpus: Sequence[DiscoveredGpu]) -> str:
    kinds: dict[tuple[str, str | None], int] = {}
    for g in gpus:
        kinds[(g.model, g.gpu_type)] = kinds.get((g.model, g.gpu_type), 0) + 1
    parts = [
        f"{n} x {model} ({gpu_type or 'not in the gpufence catalogue'})"
        for (model, gpu_type), n in kinds.items()
    ]
    text = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}: {', '.join(parts)}"
    mig = [g.index for g in gpus if g.mig_enabled]
    if mig:
        text += f"; MIG enabled on GPU{'s' if len(mig) > 1 else ''} {number_ranges(mig)}"
    return text


def fake_gpus(n: int, gpu_type: str = "H100-80GB") -> Discovery:
    """``n`` made-up GPUs of a catalogue type on this machine (the --fake-gpus mode)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise DiscoveryError(f"--fake-gpus needs a number of GPUs of at least 1 (got {n!r})")
    if gpu_type not in CATALOGUE:
        types = builtin_gpu_types()
        raise DiscoveryError(
            f"--fake-gpu-type {gpu_type!r} is not a built-in GPU type "
            f"(valid: {name_list(types)}){suggest(gpu_type, types)}"
        )
    t = CATALOGUE[gpu_type]
    nvlink = t.nvlink_gbps > 0  # SXM parts: one NVSwitch domain; PCIe-only parts: none
    gpus = tuple(
        DiscoveredGpu(
            index=i,
            uuid=f"GPU-fake-{i:04d}",
            model=f"FAKE {gpu_type}",
            gpu_type=gpu_type,
            memory_mib=t.memory_mib,
            mig_enabled=False,
            mig_devices=(),
            nvlink_peers=tuple(j for j in range(n) if j != i) if nvlink else (),
            nvlink_reported=True,
        )
        for i in range(n)
    )
    many = "s" if n != 1 else ""
    source = f"{n} FAKE {gpu_type} GPU{many} (--fake-gpus): no real device is used"
    return Discovery(gpus, fake=True, driver=None, source=source)


# -- one-node cluster spec ---------------------------------------------------------------------

_MEMINFO = Path("/proc/meminfo")


def host_memory_gib(meminfo: Path = _MEMINFO) -> int | None:
    """Total host memory in whole GiB from /proc/meminfo, or None where it cannot be read."""
    try:
        text = meminfo.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, flags=re.MULTILINE)
    return max(1, int(m.group(1)) // (1 << 20)) if m else None


def nvlink_domain_sizes(gpus: Sequence[DiscoveredGpu]) -> list[int]:
    """NVLink domain sizes for a node's nvlink_domains (consecutive GPU index runs).

    Unknown everywhere (no GPU reported NVLink state) gives one domain, the spec's default.
    Otherwise the connected components of the peer graph; the spec can only express runs of
    consecutive indices, so a component like {0, 2} is split into runs that each stay inside
    one component (never claiming a link that is not there).
    """
    n = len(gpus)
    if not any(g.nvlink_reported for g in gpus):
        return [n]
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for g in gpus:
        for p in g.nvlink_peers:
            if 0 <= p < n:
                parent[root(g.index)] = root(p)
    sizes: list[int] = []
    for i in range(n):
        if i > 0 and root(i) == root(i - 1):
            sizes[-1] += 1
        else:
            sizes.append(1)
    return sizes


def _node_type(gpus: Sequence[DiscoveredGpu]) -> tuple[str, GpuType | None]:
    """The one gpu_type of the node, and the declaration it needs if not in the catalogue."""
    by_type: dict[str, list[int]] = {}
    for g in gpus:
        by_type.setdefault(spec_gpu_type(g), []).append(g.index)
    if len(by_type) > 1:
        shown = "; ".join(f"GPU {number_ranges(ix)}: {t}" for t, ix in by_type.items())
        raise DiscoveryError(
            f"this machine has GPUs of different types ({shown}); a node group holds one GPU "
            "type, so describe this machine in a cluster file and pass it with --config FILE"
        )
    first = gpus[0]
    return spec_gpu_type(first), None if first.gpu_type is not None else _custom_type(first)


def _mig_layout(g: DiscoveredGpu, model: str | None) -> tuple[str, ...]:
    if model is None:
        raise DiscoveryError(
            f"GPU {g.index} ({g.model}) has MIG enabled, but gpufence has no MIG profiles for it "
            "(MIG-capable types: "
            f"{name_list(t.name for t in CATALOGUE.values() if t.mig_model)}); disable MIG "
            "(nvidia-smi -i N -mig 0) or describe the machine with --config FILE"
        )
    if not g.mig_devices:
        raise DiscoveryError(
            f"GPU {g.index} has MIG enabled but no MIG instances, so no job could use it: "
            "create instances (nvidia-smi mig -cgi ... -C), disable MIG, or describe the "
            "machine with --config FILE"
        )
    # Several compute instances of one GPU instance share its placement: list it once.
    seen: set[tuple[str, int]] = set()
    layout: list[str] = []
    for m in g.mig_devices:
        if m.start is None:
            layout.append(m.profile)
        elif (m.profile, m.start) not in seen:
            seen.add((m.profile, m.start))
            layout.append(f"{m.profile}@{m.start}")
    problems = mig_layout_problems(model, layout)
    if problems:
        raise DiscoveryError(
            f"GPU {g.index}: its MIG layout [{', '.join(layout)}] is not one gpufence knows "
            f"for {model}: {'; '.join(msg for _, msg in problems)}; describe the machine "
            "with --config FILE"
        )
    return tuple(layout)


def _partitions(gpus: Sequence[DiscoveredGpu], group: str, mig_model: str | None) -> dict[str, Any]:
    admits = [c.value for c in WorkloadClass]
    plain = [g.index for g in gpus if not g.mig_enabled]
    layouts: dict[tuple[str, ...], list[int]] = {}
    for g in gpus:
        if g.mig_enabled:
            layouts.setdefault(_mig_layout(g, mig_model), []).append(g.index)

    def selectors(indices: list[int]) -> list[str]:
        return [f"{group}:{r}" for r in number_ranges(indices).split(",")]

    out: dict[str, Any] = {}
    if plain:
        fence: dict[str, Any] = (
            {"nodes": [group]} if len(plain) == len(gpus) else {"gpus": selectors(plain)}
        )
        out["shared"] = {**fence, "admits": admits, "sharing": "exclusive", "backfill": True}
    for k, (layout, indices) in enumerate(layouts.items(), start=1):
        name = "mig" if len(layouts) == 1 else f"mig-{k}"
        out[name] = {
            "gpus": selectors(indices),
            "admits": admits,
            "sharing": "mig",
            "mig": {"layout": list(layout), "dynamic": False},
            "backfill": True,
        }
    return out


def node_spec(d: Discovery, node_name: str = "local") -> dict[str, Any]:
    """A cluster-spec dict for this one node: a node group of count 1 (node ``<name>-0``).

    Whole GPUs go into one exclusive partition ``shared`` admitting every class. GPUs that
    have MIG enabled cannot be handed out whole: they go into ``mig`` partitions (one per
    distinct layout: ``mig``, or ``mig-1``, ``mig-2``...) with the discovered instances as a
    fixed layout. cpu_cores and memory_gib are this host's.
    """
    if not re.fullmatch(NAME_RE, node_name):
        raise DiscoveryError(
            f"node name {node_name!r} is not usable in a cluster spec (letters, digits, '_', "
            "'.' and '-', starting with a letter or digit)"
        )
    gpus = sorted(d.gpus, key=lambda g: g.index)
    if not gpus:
        raise DiscoveryError(f"no GPUs to describe ({d.source})")
    if [g.index for g in gpus] != list(range(len(gpus))):
        raise DiscoveryError(
            f"GPU indices {[g.index for g in gpus]} are not 0..{len(gpus) - 1}; "
            "describe the machine with --config FILE"
        )
    type_name, declared = _node_type(gpus)
    mig_model = CATALOGUE[type_name].mig_model if declared is None else None
    group: dict[str, Any] = {
        "name": node_name,
        "count": 1,
        "gpus_per_node": len(gpus),
        "gpu_type": type_name,
        "nvlink_domains": nvlink_domain_sizes(gpus),
    }
    cores = os.cpu_count()
    if cores:
        group["cpu_cores"] = cores
    memory = host_memory_gib()
    if memory:
        group["memory_gib"] = memory
    spec: dict[str, Any] = {"name": node_name}
    if declared is not None:
        spec["gpu_types"] = [{"name": declared.name, "memory_gib": declared.memory_gib}]
    spec["node_groups"] = [group]
    spec["partitions"] = _partitions(gpus, node_name, mig_model)
    return spec
