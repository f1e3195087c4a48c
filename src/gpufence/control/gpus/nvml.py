"""The NVML surface gpufence uses, its pynvml adapter, and NVML names -> catalogue names.

Every NVML call goes through a Protocol, so everything runs against an in-memory fake in tests
(``gpufence.testing.fake_nvml``): ``NvmlApi`` is what discovery reads, ``GpuApi`` adds what the
control plane does on real GPUs (MIG instance create/destroy, the processes on a GPU,
utilisation, memory, PCIe and NVLink throughput: the counters ``gpu_counters.py`` samples).
``PynvmlApi`` implements both over the ``pynvml`` module of ``nvidia-ml-py``, imported when it
is created. ``catalogue_type`` and ``mig_profile_name`` map what NVML says about
a GPU or a MIG GPU instance to gpufence catalogue names.
"""

from __future__ import annotations

import ctypes
import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, cast

from gpufence.control.gpus.records import DiscoveryError
from gpufence.model.mig import MigProfile
from gpufence.spec.catalogue import CATALOGUE

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
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_UNKNOWN = 999
NVML_DEVICE_MIG_ENABLE = 1
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 36  # nvml.h; H100/H200 use 18, A100 12, V100 6 (the rest: not found)
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
# NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE by compute slices: the one full-width compute
# instance of a GPU instance (what `nvidia-smi mig -cgi ... -C` creates)
NVML_CI_PROFILE_BY_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}
NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
NVML_NO_INSTANCE_ID = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a non-MIG process
NVML_PCIE_UTIL_TX_BYTES = 0  # nvmlDeviceGetPcieThroughput counters: KB/s over a 20 ms sample
NVML_PCIE_UTIL_RX_BYTES = 1
# nvmlDeviceGetFieldValues: NVLink data payload counters in KiB since the driver loaded; the
# scope is a link, or NVML_SCOPE_ALL_LINKS for the sum over the GPU's links (nvml.h)
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_SCOPE_ALL_LINKS = 0xFFFFFFFF
NVML_SUCCESS = 0

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

NO_GPU_HINT = (
    "use --fake-gpus N to run gpufence without GPUs, or --config FILE to describe the cluster"
)


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

    @property
    def used(self) -> int: ...


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
    def id(self) -> int: ...

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
    def nvmlDeviceGetComputeInstanceId(self, mig_handle: object) -> int: ...
    def nvmlDeviceGetMinorNumber(self, handle: object) -> int: ...
    def nvmlDeviceGetGpuInstanceById(self, handle: object, gi_id: int) -> object: ...
    def nvmlGpuInstanceGetInfo(self, gpu_instance: object) -> GpuInstanceInfo: ...
    def nvmlDeviceGetAttributes(self, mig_handle: object) -> DeviceAttributes: ...
    def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int: ...
    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: object, link: int) -> PciInfo: ...


class ProfileInfo(Protocol):
    @property
    def id(self) -> int: ...  # the profile ID to create an instance with


class ProcessInfo(Protocol):
    """One process NVML sees on a GPU (``nvmlProcessInfo_t``)."""

    @property
    def pid(self) -> int: ...

    @property
    def usedGpuMemory(self) -> int | None: ...

    @property
    def gpuInstanceId(self) -> int: ...  # NVML_NO_INSTANCE_ID outside MIG

    @property
    def computeInstanceId(self) -> int: ...


class Utilization(Protocol):
    @property
    def gpu(self) -> int: ...  # percent of the last sample period a kernel ran


class FieldNumber(Protocol):
    """The union ``c_nvmlValue_t``: the NVLink counters are unsigned long longs."""

    @property
    def ullVal(self) -> int: ...


class FieldValue(Protocol):
    """One answer of ``nvmlDeviceGetFieldValues`` (``nvmlFieldValue_t``): its own return code."""

    @property
    def fieldId(self) -> int: ...

    @property
    def scopeId(self) -> int: ...

    @property
    def nvmlReturn(self) -> int: ...

    @property
    def value(self) -> FieldNumber: ...


class GpuApi(NvmlApi, Protocol):
    """What the control plane does on real GPUs besides discovery (each raises NvmlError).

    MIG: GPU instances are created with an explicit placement, each with one full-width compute
    instance; destroying a GPU instance needs its compute instances destroyed first, and NVML
    refuses either (NVML_ERROR_IN_USE) while processes run on it. MIG mode itself is never
    changed by gpufence (that needs an idle GPU and often a reset: the operator's call).
    """

    def nvmlDeviceGetGpuInstances(self, handle: object, profile_id: int) -> Sequence[object]: ...
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: object, profile_id: int, placement: GpuInstancePlacement
    ) -> object: ...
    def nvmlGpuInstanceDestroy(self, gpu_instance: object) -> None: ...
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpu_instance: object, profile: int, eng_profile: int
    ) -> ProfileInfo: ...
    def nvmlGpuInstanceCreateComputeInstance(
        self, gpu_instance: object, profile_id: int
    ) -> object: ...
    def nvmlGpuInstanceGetComputeInstances(
        self, gpu_instance: object, profile_id: int
    ) -> Sequence[object]: ...
    def nvmlComputeInstanceDestroy(self, compute_instance: object) -> None: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> Sequence[ProcessInfo]: ...
    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Utilization: ...
    def nvmlDeviceGetPcieThroughput(self, handle: object, counter: int) -> int: ...
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: object) -> int: ...
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: object) -> int: ...
    def nvmlDeviceGetFieldValues(
        self, handle: object, field_ids: Sequence[tuple[int, int]]
    ) -> Sequence[FieldValue]: ...


class PynvmlApi:
    """NvmlApi and GpuApi over the ``pynvml`` module of nvidia-ml-py, imported when this is
    created."""

    def __init__(self) -> None:
        try:
            self._nv: Any = importlib.import_module("pynvml")
        except ImportError as exc:
            raise DiscoveryError(
                "cannot discover GPUs: the NVML bindings are not installed "
                f"(pip install nvidia-ml-py); {NO_GPU_HINT}"
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

    def nvmlDeviceGetComputeInstanceId(self, mig_handle: object) -> int:
        return int(self._call("nvmlDeviceGetComputeInstanceId", mig_handle))

    def nvmlDeviceGetMinorNumber(self, handle: object) -> int:
        """N of the GPU's ``/dev/nvidiaN`` (not always its NVML index)."""
        return int(self._call("nvmlDeviceGetMinorNumber", handle))

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

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Utilization:
        """Used by idle detection (``gpus.activity``): ``.gpu`` is a percentage."""
        return cast("Utilization", self._call("nvmlDeviceGetUtilizationRates", handle))

    def nvmlDeviceGetPcieThroughput(self, handle: object, counter: int) -> int:
        """KB/s through the PCIe link in one direction, over NVML's 20 ms sample."""
        return int(self._call("nvmlDeviceGetPcieThroughput", handle, counter))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: object) -> int:
        """The highest generation this GPU and this machine's slot can both run."""
        return int(self._call("nvmlDeviceGetMaxPcieLinkGeneration", handle))

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: object) -> int:
        return int(self._call("nvmlDeviceGetMaxPcieLinkWidth", handle))

    def nvmlDeviceGetFieldValues(
        self, handle: object, field_ids: Sequence[tuple[int, int]]
    ) -> Sequence[FieldValue]:
        """(field id, scope id) pairs; pynvml fills a ``c_nvmlFieldValue_t`` array."""
        return cast(
            "Sequence[FieldValue]",
            self._call("nvmlDeviceGetFieldValues", handle, [tuple(f) for f in field_ids]),
        )

    # -- MIG instances (GpuApi); pynvml takes ctypes arrays and structs for these ----------
    def nvmlDeviceGetGpuInstances(self, handle: object, profile_id: int) -> Sequence[object]:
        arr = (self._nv.c_nvmlGpuInstance_t * 8)()  # at most 7 per GPU
        count = ctypes.c_uint(0)
        self._call("nvmlDeviceGetGpuInstances", handle, profile_id, arr, ctypes.byref(count))
        return [arr[i] for i in range(count.value)]

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: object, profile_id: int, placement: GpuInstancePlacement
    ) -> object:
        c_place = self._nv.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)
        return self._call(
            "nvmlDeviceCreateGpuInstanceWithPlacement", handle, profile_id, ctypes.byref(c_place)
        )

    def nvmlGpuInstanceDestroy(self, gpu_instance: object) -> None:
        self._call("nvmlGpuInstanceDestroy", gpu_instance)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpu_instance: object, profile: int, eng_profile: int
    ) -> ProfileInfo:
        name = "nvmlGpuInstanceGetComputeInstanceProfileInfo"
        try:
            return cast("ProfileInfo", self._call(name, gpu_instance, profile, eng_profile))
        except NvmlError as exc:  # drivers before the v2 struct
            if exc.value != NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
            return cast("ProfileInfo", self._call(name, gpu_instance, profile, eng_profile, 1))

    def nvmlGpuInstanceCreateComputeInstance(self, gpu_instance: object, profile_id: int) -> object:
        return self._call("nvmlGpuInstanceCreateComputeInstance", gpu_instance, profile_id)

    def nvmlGpuInstanceGetComputeInstances(
        self, gpu_instance: object, profile_id: int
    ) -> Sequence[object]:
        arr = (self._nv.c_nvmlComputeInstance_t * 8)()
        count = ctypes.c_uint(0)
        self._call(
            "nvmlGpuInstanceGetComputeInstances", gpu_instance, profile_id, arr, ctypes.byref(count)
        )
        return [arr[i] for i in range(count.value)]

    def nvmlComputeInstanceDestroy(self, compute_instance: object) -> None:
        self._call("nvmlComputeInstanceDestroy", compute_instance)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> Sequence[ProcessInfo]:
        return cast(
            "Sequence[ProcessInfo]", self._call("nvmlDeviceGetComputeRunningProcesses", handle)
        )


def as_text(value: str | bytes) -> str:
    """An NVML string (some pynvml versions give bytes) as str."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


T = TypeVar("T")


def maybe(call: Callable[..., T], *args: object) -> T | None:
    """The call's answer, or None where NVML cannot tell (not supported, no permission...)."""
    try:
        return call(*args)
    except NvmlError as exc:
        if exc.value in _UNAVAILABLE:
            return None
        raise


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


def mig_profile_name(
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
