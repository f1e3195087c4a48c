"""One GPU's MIG instances through NVML: read them, and change them into a target layout.

``read_instances`` lists every GPU instance (GI) of a GPU with its profile, placement, compute
instances (CIs), and the UUID and GI / CI ids of its MIG device (the ids name its capability
devices: ``devnodes.mig_nodes``). ``apply_layout`` turns the GPU into a target
layout ("profile@start" instances, each a GI with one full-width CI): GIs already in the target
are kept (their UUIDs stay), the others are destroyed -- never one a process runs on -- and the
missing ones are created with their explicit placement, largest first (the driver's own order
can fail with "Insufficient Resources", MIG user guide). Any NVML failure stops it where it is
and raises ``MigApplyError`` naming the step; the caller re-reads what the GPU then has.

MIG mode is never changed here (``nvmlDeviceSetMigMode`` is not even in the API surface).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpufence.control.gpus.nvml import (
    NVML_CI_PROFILE_BY_SLICES,
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    GpuApi,
    NvmlError,
    as_text,
    maybe,
)
from gpufence.model.mig import MigInstance, MigProfile

# Answers that mean "none of these here" when listing instances, not a failure.
_ABSENT = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND})


class MigApplyError(RuntimeError):
    """An NVML call failed while changing a GPU's MIG instances; the message names the step."""


@dataclass(frozen=True)
class Placement:
    """An ``nvmlGpuInstancePlacement_t`` to create a GPU instance with."""

    start: int
    size: int


@dataclass(frozen=True)
class DeviceInstance:
    """One GPU instance as the GPU has it."""

    gi_id: int
    profile: str | None  # catalogue name; None: a profile ID the catalogue does not know
    profile_id: int
    start: int
    size: int
    compute_instances: int
    uuid: str | None  # the MIG device of its one compute instance (None: no CI, or several)
    ci_id: int | None = None  # that compute instance's id (None: NVML would not say)
    handle: object = field(default=None, compare=False, repr=False)
    ci_handles: tuple[object, ...] = field(default=(), compare=False, repr=False)

    @property
    def complete(self) -> bool:
        """A GI gpufence can hand out: a catalogue profile with exactly one compute instance."""
        return self.profile is not None and self.uuid is not None

    @property
    def entry(self) -> str:
        return f"{self.profile or f'profile-{self.profile_id}'}@{self.start}"


def _nvml(step: str, exc: NvmlError) -> MigApplyError:
    return MigApplyError(f"{step}: NVML error {exc.value} ({exc})")


def _compute_instances(api: GpuApi, gi: object) -> list[object]:
    out: list[object] = []
    for profile in range(NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            info = api.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, profile, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
            out += api.nvmlGpuInstanceGetComputeInstances(gi, int(info.id))
        except NvmlError as exc:
            if exc.value not in _ABSENT:
                raise
    return out


def _mig_uuids(api: GpuApi, handle: object) -> dict[int, list[tuple[str, int | None]]]:
    """GPU instance ID -> (UUID, compute instance ID) of its MIG devices (one per compute
    instance)."""
    out: dict[int, list[tuple[str, int | None]]] = {}
    for k in range(api.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = api.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)
        except NvmlError as exc:
            if exc.value in _ABSENT:
                continue  # an empty slot
            raise
        gi_id = int(api.nvmlDeviceGetGpuInstanceId(mig))
        ci_id = maybe(api.nvmlDeviceGetComputeInstanceId, mig)
        uuid = as_text(api.nvmlDeviceGetUUID(mig))
        out.setdefault(gi_id, []).append((uuid, None if ci_id is None else int(ci_id)))
    return out


def read_instances(
    api: GpuApi, handle: object, profiles: Mapping[str, MigProfile]
) -> list[DeviceInstance]:
    """Every GPU instance of the GPU, sorted by placement start (NvmlError if NVML fails)."""
    name_of = {p.gi_profile_id: p.name for p in profiles.values()}
    uuids = _mig_uuids(api, handle)
    out: list[DeviceInstance] = []
    for profile_id in sorted(name_of):
        try:
            gis = api.nvmlDeviceGetGpuInstances(handle, profile_id)
        except NvmlError as exc:
            if exc.value in _ABSENT:
                continue  # a profile this GPU does not offer
            raise
        for gi in gis:
            info = api.nvmlGpuInstanceGetInfo(gi)
            cis = _compute_instances(api, gi)
            mine = uuids.get(int(info.id), [])
            one = mine[0] if len(cis) == 1 and len(mine) == 1 else None
            out.append(
                DeviceInstance(
                    gi_id=int(info.id),
                    profile=name_of.get(int(info.profileId)),
                    profile_id=int(info.profileId),
                    start=int(info.placement.start),
                    size=int(info.placement.size),
                    compute_instances=len(cis),
                    uuid=None if one is None else one[0],
                    ci_id=None if one is None else one[1],
                    handle=gi,
                    ci_handles=tuple(cis),
                )
            )
    return sorted(out, key=lambda d: (d.start, d.gi_id))


def layout_of(instances: Sequence[DeviceInstance]) -> tuple[str, ...]:
    """The "profile@start" layout of the instances gpufence can use (complete ones)."""
    return tuple(d.entry for d in instances if d.complete)


def uuids_of(instances: Sequence[DeviceInstance]) -> dict[tuple[str, int], str]:
    return {
        (d.profile, d.start): d.uuid
        for d in instances
        if d.complete and d.profile is not None and d.uuid is not None
    }


def ids_of(instances: Sequence[DeviceInstance]) -> dict[tuple[str, int], tuple[int, int | None]]:
    """(profile, start) -> (GPU instance ID, compute instance ID) of the complete instances."""
    return {
        (d.profile, d.start): (d.gi_id, d.ci_id)
        for d in instances
        if d.complete and d.profile is not None
    }


def busy_instances(api: GpuApi, handle: object) -> dict[int, list[int]]:
    """GPU instance ID -> pids NVML sees running on it."""
    out: dict[int, list[int]] = {}
    for p in api.nvmlDeviceGetComputeRunningProcesses(handle):
        out.setdefault(int(p.gpuInstanceId), []).append(int(p.pid))
    return out


def apply_layout(
    api: GpuApi,
    handle: object,
    profiles: Mapping[str, MigProfile],
    target: Sequence[MigInstance],
) -> None:
    """Make the GPU's instances ``target`` (see the module docstring); MigApplyError on failure."""
    try:
        current = read_instances(api, handle, profiles)
        busy = busy_instances(api, handle)
    except NvmlError as exc:
        raise _nvml("reading the GPU's MIG instances", exc) from exc
    wanted = set(target)
    kept = {
        MigInstance(d.profile, d.start)
        for d in current
        if d.complete and d.profile is not None and MigInstance(d.profile, d.start) in wanted
    }
    doomed = [
        d
        for d in current
        if not (d.complete and d.profile is not None and MigInstance(d.profile, d.start) in kept)
    ]
    for d in doomed:  # no NVML call before every one is known to be idle
        pids = busy.get(d.gi_id)
        if pids:
            shown = ", ".join(str(p) for p in sorted(pids))
            raise MigApplyError(f"GPU instance {d.entry} is in use by pid {shown}: not destroyed")
    for d in doomed:
        step = f"destroying GPU instance {d.entry}"
        try:
            for ci in d.ci_handles:
                api.nvmlComputeInstanceDestroy(ci)
            api.nvmlGpuInstanceDestroy(d.handle)
        except NvmlError as exc:
            raise _nvml(step, exc) from exc
    todo = sorted(
        (i for i in target if i not in kept),
        key=lambda i: (
            -profiles[i.profile].mem_slices,
            -profiles[i.profile].compute_slices,
            i.start,
        ),
    )
    for inst in todo:
        p = profiles[inst.profile]
        step = f"creating GPU instance {inst.profile}@{inst.start}"
        try:
            gi = api.nvmlDeviceCreateGpuInstanceWithPlacement(
                handle, p.gi_profile_id, Placement(inst.start, p.mem_slices)
            )
            step = f"creating the compute instance of {inst.profile}@{inst.start}"
            info = api.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi,
                NVML_CI_PROFILE_BY_SLICES[p.compute_slices],
                NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            api.nvmlGpuInstanceCreateComputeInstance(gi, int(info.id))
        except NvmlError as exc:
            raise _nvml(step, exc) from exc
