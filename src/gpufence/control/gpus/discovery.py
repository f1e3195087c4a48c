"""This machine's GPUs, found through NVML (or made up with --fake-gpus).

``discover()`` asks NVML (the ``nvidia-ml-py`` package, module ``pynvml``, imported on first use)
for every GPU: name, UUID, memory, MIG mode and instances (profile + placement start), and the
GPUs each one reaches over NVLink. ``fake_gpus()`` makes the same description without hardware.
``node_spec()`` (``nodespec.py``) turns either into a cluster-spec dict (the format of
``gpufence.spec``) for one node, which ``gpufence.spec.cluster_from_dict`` loads.

Every NVML call goes through ``NvmlApi`` (``gpufence.control.gpus.nvml``), so the logic runs against
an in-memory fake in tests. The records (``gpufence.control.gpus.records``), the NVML surface and
the node spec are re-exported here.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence

from gpufence.control.gpus.devnodes import DRIVER, gpu_node, mig_nodes
from gpufence.control.gpus.nodespec import node_spec, spec_gpu_type
from gpufence.control.gpus.nvml import (
    NO_GPU_HINT,
    NVML_DEVICE_MIG_ENABLE,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_FOUND,
    NVML_FEATURE_ENABLED,
    NVML_NVLINK_MAX_LINKS,
    NvmlApi,
    NvmlError,
    PciInfo,
    PynvmlApi,
    as_text,
    catalogue_type,
    maybe,
    mig_profile_name,
)
from gpufence.control.gpus.records import (
    CapsTree,
    DiscoveredGpu,
    Discovery,
    DiscoveryError,
    MigDevice,
)
from gpufence.model.mig import MIG_CATALOGUE
from gpufence.spec.catalogue import CATALOGUE, builtin_gpu_types
from gpufence.spec.errors import name_list, number_ranges, suggest

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

_MIB = 1 << 20
_BUS_RE = re.compile(r"^(?:([0-9a-f]+):)?([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+)$")


def _bus_key(pci: PciInfo) -> str:
    """A PCI bus ID in one spelling ("00000000:07:00.0" and "0000:07:00.0" are one device)."""
    text = as_text(pci.busId).strip().lower()
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
    return f"cannot discover GPUs: {why}; {NO_GPU_HINT}"


def _mig_devices(
    api: NvmlApi,
    index: int,
    handle: object,
    gpu_type: str | None,
    minor: int | None,
    caps: CapsTree,
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
        uuid = as_text(api.nvmlDeviceGetUUID(mig))
        # The GPU-instance handle needs a privileged user on some drivers; the MIG device's
        # attributes do not, but give no placement.
        gi_id = maybe(api.nvmlDeviceGetGpuInstanceId, mig)
        gi = None if gi_id is None else maybe(api.nvmlDeviceGetGpuInstanceById, handle, gi_id)
        info = None if gi is None else maybe(api.nvmlGpuInstanceGetInfo, gi)
        attrs = maybe(api.nvmlDeviceGetAttributes, mig)
        name = mig_profile_name(
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
        ci_id = maybe(api.nvmlDeviceGetComputeInstanceId, mig)
        nodes = () if minor is None or gi_id is None else mig_nodes(minor, gi_id, ci_id, caps)
        out.append(MigDevice(uuid, name, start, nodes))
    return tuple(sorted(out, key=lambda m: (m.start is None, m.start or 0, m.profile, m.uuid)))


def _nvlink_remotes(api: NvmlApi, handle: object) -> tuple[bool, list[str | None]]:
    """(whether NVML reported any link state, remote bus IDs of active links; None: unknown)."""
    reported = False
    remotes: list[str | None] = []
    for link in range(NVML_NVLINK_MAX_LINKS):
        state = maybe(api.nvmlDeviceGetNvLinkState, handle, link)
        if state is None:
            continue  # no such link, or no NVLink on this GPU (PCIe card), or cannot say
        reported = True
        if state == NVML_FEATURE_ENABLED:
            pci = maybe(api.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
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


def discover(nvml: NvmlApi | None = None, caps: CapsTree = DRIVER) -> Discovery:
    """This machine's GPUs as NVML reports them; DiscoveryError says why there are none.
    ``caps``: where the driver publishes MIG capabilities (tests give their own tree)."""
    api: NvmlApi = nvml if nvml is not None else PynvmlApi()
    try:
        api.nvmlInit()
    except NvmlError as exc:
        raise DiscoveryError(_init_failure(exc)) from exc
    try:
        return _discover(api, caps)
    except NvmlError as exc:
        raise DiscoveryError(f"GPU discovery failed: NVML: {exc}") from exc
    finally:
        with contextlib.suppress(NvmlError):
            api.nvmlShutdown()


def _discover(api: NvmlApi, caps: CapsTree) -> Discovery:
    driver = as_text(api.nvmlSystemGetDriverVersion())
    nvml_version = maybe(api.nvmlSystemGetNVMLVersion)
    count = api.nvmlDeviceGetCount()
    if count < 1:
        raise DiscoveryError(
            f"cannot discover GPUs: NVML (driver {driver}) sees no GPU on this machine "
            f"(check CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES); {NO_GPU_HINT}"
        )
    rows: list[tuple[int, str, str, str | None, int, bool, tuple[MigDevice, ...]]] = []
    buses: list[str | None] = []
    remotes: list[list[str | None]] = []
    reported: list[bool] = []
    nodes: list[tuple[str, ...]] = []
    minors: list[int | None] = []
    for i in range(count):
        try:
            handle = api.nvmlDeviceGetHandleByIndex(i)
            model = as_text(api.nvmlDeviceGetName(handle)).strip()
            uuid = as_text(api.nvmlDeviceGetUUID(handle))
            memory_mib = int(api.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
            gpu_type = catalogue_type(model, memory_mib)
            mode = maybe(api.nvmlDeviceGetMigMode, handle)
            mig_enabled = mode is not None and int(mode[0]) == NVML_DEVICE_MIG_ENABLE
            minor = maybe(api.nvmlDeviceGetMinorNumber, handle)
            migs = _mig_devices(api, i, handle, gpu_type, minor, caps) if mig_enabled else ()
            pci = maybe(api.nvmlDeviceGetPciInfo, handle)
            has_links, ends = _nvlink_remotes(api, handle)
        except NvmlError as exc:
            raise DiscoveryError(f"GPU discovery failed on GPU {i}: NVML: {exc}") from exc
        rows.append((i, uuid, model, gpu_type, memory_mib, mig_enabled, migs))
        nodes.append(() if minor is None else (gpu_node(minor),))
        minors.append(None if minor is None else int(minor))
        buses.append(None if pci is None else _bus_key(pci))
        remotes.append(ends)
        reported.append(has_links)
    peers = _nvlink_peers(buses, remotes)
    gpus = tuple(
        DiscoveredGpu(
            *row,
            nvlink_peers=tuple(sorted(peers[k])),
            nvlink_reported=reported[k],
            device_nodes=nodes[k],
            minor=minors[k],
        )
        for k, row in enumerate(rows)
    )
    version = as_text(nvml_version) if nvml_version is not None else None
    head = f"NVML {version} (driver {driver})" if version else f"NVIDIA driver {driver}"
    source = f"{head}: {_summary(gpus)}"
    return Discovery(gpus, fake=False, driver=driver, source=source, caps=caps)


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


MAX_FAKE_GPUS = 256
"""Made-up GPUs of one machine: far more than any real one holds (start-up and device-rule work
grow with the count; a typo of 10**6 would stall ``gpufence up`` for minutes)."""


def fake_gpus(n: int, gpu_type: str = "H100-80GB") -> Discovery:
    """``n`` made-up GPUs of a catalogue type on this machine (the --fake-gpus mode)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_FAKE_GPUS:
        raise DiscoveryError(
            f"--fake-gpus needs a number of GPUs from 1 to {MAX_FAKE_GPUS} (one machine's; "
            f"got {n!r})"
        )
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
