"""Dynamic Resource Allocation (``resource.k8s.io/v1``) objects, as plain values.

Where the nodes publish ResourceSlices (the NVIDIA DRA driver: driver ``gpu.nvidia.com``, one
device per GPU with attributes ``index``, ``uuid``, ``productName``, ``type: gpu``), a pod asks
for GPUs through ResourceClaims instead of ``nvidia.com/gpu``, and the scheduler -- gpufence
here -- allocates each claim itself: it writes the exact devices into the claim's status before
it binds the pod, so the GPUs the core chose (NVLink, fragmentation) are the ones that run.

This module copies what gpufence needs out of the API's objects (as kube/objects.py does for
Nodes and Pods) and says what one claim write holds. No I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

DRIVER = "gpu.nvidia.com"  # the NVIDIA DRA driver's name (its slices' and results' driver)
# DeviceClasses whose devices are whole GPUs of that driver (the driver's chart installs
# ``gpu.nvidia.com``; its selector is ``device.attributes['gpu.nvidia.com'].type == 'gpu'``)
GPU_CLASSES = frozenset({"gpu.nvidia.com"})
# the DeviceClass of MIG devices; a request names its profile with one selector of this form
MIG_CLASS = "mig.nvidia.com"
_MIG_SELECTOR = re.compile(
    r"^\s*device\.attributes\[\s*['\"]gpu\.nvidia\.com['\"]\s*\]\.profile\s*==\s*"
    r"['\"]([0-9a-z.+]+)['\"]\s*$"
)
# set on a claim while gpufence's allocation holds it, as kube-scheduler does, so a claim in
# use is not deleted under its pod (removed when the allocation is cleared)
FINALIZER = "resource.kubernetes.io/delete-protection"


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One GPU a node's driver published."""

    name: str  # the device's name in its pool ("gpu-0")
    index: int  # the GPU's index on the node (the driver's ``index`` attribute)
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG instance a node's driver published (the instances the MIG manager cut)."""

    name: str  # canonical: gpu-<parent minor>-mig-<GI profile id>-<start>-<size>
    parent: int  # the index of the GPU it is cut from
    profile: str  # "1g.10gb"
    start: int  # its first memory slice (the core's MIG start)


@dataclass(frozen=True, slots=True)
class ObservedSlice:
    name: str
    node: str
    driver: str
    pool: str
    gpus: tuple[SliceDevice, ...]  # its devices of type gpu with an index (MIG ones left out)
    migs: tuple[MigDevice, ...] = ()


def _attr(attributes: dict[str, Any], key: str, driver: str) -> Any:
    """An attribute's value by its plain or driver-qualified name ("index" or
    "gpu.nvidia.com/index"), whichever the driver used."""
    raw = attributes.get(key, attributes.get(f"{driver}/{key}"))
    if raw is None:
        return None
    if isinstance(raw, dict):
        return next((v for v in raw.values() if v is not None), None)
    for field in ("int", "string", "bool", "version"):
        value = getattr(raw, field, None)
        if value is not None:
            return value
    return None


_GPU_NAME = re.compile(r"^gpu-(\d+)$")


def _gpu_index(name: str, attributes: dict[str, Any], driver: str) -> int | None:
    """The GPU's index on its node: the ``index`` attribute (the driver's earlier releases),
    else ``minor``, else the number in the device's canonical name ``gpu-<minor>`` (its later
    releases publish no index: the name carries the minor number, which is the index NVML and
    feature discovery count by on the node)."""
    for key in ("index", "minor"):
        value = _attr(attributes, key, driver)
        if isinstance(value, int):
            return value
    m = _GPU_NAME.match(name)
    return int(m.group(1)) if m else None


_MIG_NAME = re.compile(r"^gpu-(\d+)-mig-\d+-(\d+)-\d+$")
_MEMORY_SLICE = re.compile(r"^memorySlice\d+$")


def _mig(dev: Any, driver: str, parents: dict[str, int]) -> MigDevice | None:
    """A MIG device: its parent by ``parentUUID`` (else the canonical name's minor), its start
    by its lowest ``memorySlice<i>`` capacity (else the name's)."""
    attributes = dict(dev.attributes or {})
    profile = _attr(attributes, "profile", driver)
    named = _MIG_NAME.match(dev.name)
    parent = parents.get(str(_attr(attributes, "parentUUID", driver) or ""))
    slices = [int(k[11:]) for k in dev.capacity or {} if _MEMORY_SLICE.match(k)]
    start = min(slices) if slices else (int(named.group(2)) if named else None)
    if parent is None and named:
        parent = int(named.group(1))
    if not isinstance(profile, str) or parent is None or start is None:
        return None
    return MigDevice(dev.name, parent, profile, start)


def observe_slice(obj: Any) -> ObservedSlice:
    spec = obj.spec
    gpus: list[SliceDevice] = []
    migs: list[Any] = []
    for dev in spec.devices or ():
        attributes = dict(dev.attributes or {})
        kind = _attr(attributes, "type", spec.driver)
        if kind == "mig":
            migs.append(dev)
            continue
        index = _gpu_index(dev.name, attributes, spec.driver)
        if kind not in (None, "gpu") or index is None:
            continue  # a MIG or passthrough device, or none gpufence can place
        uuid = _attr(attributes, "uuid", spec.driver)
        gpus.append(SliceDevice(dev.name, index, str(uuid or "")))
    parents = {d.uuid: d.index for d in gpus if d.uuid}
    found = (_mig(dev, spec.driver, parents) for dev in migs)
    return ObservedSlice(
        name=obj.metadata.name or "",
        node=spec.nodeName or "",
        driver=spec.driver,
        pool=spec.pool.name,
        gpus=tuple(sorted(gpus, key=lambda d: d.index)),
        migs=tuple(sorted((m for m in found if m), key=lambda m: (m.parent, m.start))),
    )


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    name: str
    device_class: str
    mode: str  # ExactCount | All (| FirstAvailable: a list of alternatives)
    count: int
    selectors: int = 0  # CEL selectors on the request (gpufence does not evaluate CEL)
    mig_profile: str = ""  # a MIG request: the profile its one selector names


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    request: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class ObservedClaim:
    namespace: str
    name: str
    uid: str
    requests: tuple[ClaimRequest, ...]
    allocated: tuple[AllocatedDevice, ...]  # status.allocation.devices.results
    reserved_for: tuple[str, ...]  # uids of status.reservedFor
    finalizers: tuple[str, ...] = ()
    constraints: int = 0  # spec.devices.constraints (matchAttribute: not read)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _request(req: Any) -> ClaimRequest:
    exact = req.exactly
    if exact is None:
        return ClaimRequest(req.name, "", "FirstAvailable", 0)
    mode = exact.allocationMode or "ExactCount"
    count = int(exact.count or 1) if mode == "ExactCount" else 0
    selectors = [s.cel.expression for s in exact.selectors or () if s.cel is not None]
    profile = ""
    if exact.deviceClassName == MIG_CLASS and len(selectors) == len(exact.selectors or ()) == 1:
        m = _MIG_SELECTOR.match(selectors[0])
        profile = m.group(1) if m else ""
    return ClaimRequest(
        req.name, exact.deviceClassName, mode, count, len(exact.selectors or ()), profile
    )


def observe_claim(obj: Any) -> ObservedClaim:
    meta, spec, status = obj.metadata, obj.spec, obj.status
    devices = spec.devices if spec is not None else None
    allocation = status.allocation if status is not None else None
    results = allocation.devices.results if allocation and allocation.devices else None
    return ObservedClaim(
        namespace=meta.namespace or "default",
        name=meta.name or "",
        uid=meta.uid or "",
        requests=tuple(_request(r) for r in (devices.requests if devices else None) or ()),
        allocated=tuple(
            AllocatedDevice(r.request, r.driver, r.pool, r.device) for r in results or ()
        ),
        reserved_for=tuple(
            r.uid for r in ((status.reservedFor if status is not None else None) or ())
        ),
        finalizers=tuple(meta.finalizers or ()),
        constraints=len((devices.constraints if devices else None) or ()),
    )


@dataclass(frozen=True, slots=True)
class ClaimWrite:
    """Allocate one claim to a pod: its devices on ``node`` (empty: the claim is allocated
    already, only the pod is added to ``reservedFor``), written before the pod is bound."""

    namespace: str
    claim: str
    claim_uid: str
    pod: str
    pod_uid: str
    node: str
    devices: tuple[AllocatedDevice, ...]


@dataclass(frozen=True, slots=True)
class ClaimRelease:
    """The pod ended: take it out of the claim's ``reservedFor``; with no one left, clear the
    allocation (its devices are free again) and the finalizer."""

    namespace: str
    claim: str
    pod_uid: str
