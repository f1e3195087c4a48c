"""What gpufence keeps of DRA (``resource.k8s.io/v1``) and the decisions it turns into claim
writes. No I/O: the loop feeds it the ResourceSlices and ResourceClaims the watches saw.

- A pod's ResourceClaims are read into its GPU request (``ObservedPod.claim_gpus``): whole GPUs
  of DeviceClass ``gpu.nvidia.com`` by exact count. A claim not made yet (the claim controller
  makes a template's) keeps the pod waiting, saying so; one gpufence cannot honour (another
  DeviceClass, ``All``, CEL selectors, constraints, a claim another pod holds) refuses the pod,
  naming the claim, the request and the fix -- never guessed.
- The core picks the exact GPU indices on a node (NVLink domains, fragmentation); at the bind
  they become the node's devices with those ``index`` attributes, written into each claim
  (``ClaimWrite``) before the pod is bound, so the placement the core chose is what runs.
- A node's GPUs are its allocatable ``nvidia.com/gpu``, or, where only the DRA driver
  publishes them, the GPU devices of its slices.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace

from gpufence.kube.actions import BindPod
from gpufence.kube.dra_objects import (
    DRIVER,
    GPU_CLASSES,
    MIG_CLASS,
    AllocatedDevice,
    ClaimRelease,
    ClaimWrite,
    MigDevice,
    ObservedClaim,
    ObservedSlice,
    SliceDevice,
)
from gpufence.kube.objects import ObservedNode, ObservedPod
from gpufence.kube.placement_notes import MemberPlan

_CLASSES = ", ".join(sorted(GPU_CLASSES))


@dataclass(slots=True)
class DraBook:
    slices: dict[str, ObservedSlice] = field(default_factory=dict)  # by slice name
    claims: dict[str, ObservedClaim] = field(default_factory=dict)  # by namespace/name

    def take_slices(
        self, seen: Iterable[ObservedSlice], *, deleted: bool = False, whole: bool = False
    ) -> None:
        """What a watch saw: slices added, changed or deleted, or (``whole``) all there are."""
        fresh = {s.name: s for s in seen}
        if whole:
            self.slices = {}
        for name, sl in fresh.items():
            if deleted:
                self.slices.pop(name, None)
            else:
                self.slices[name] = sl

    def take_claims(
        self, seen: Iterable[ObservedClaim], *, deleted: bool = False, whole: bool = False
    ) -> set[str]:
        """As ``take_slices``, for claims; returns the keys of the claims seen."""
        fresh = {c.key: c for c in seen}
        if whole:
            self.claims = {}
        for key, claim in fresh.items():
            if deleted:
                self.claims.pop(key, None)
            else:
                self.claims[key] = claim
        return set(fresh)

    # -- nodes ----------------------------------------------------------------------------------

    def node_gpus(self, node: str) -> dict[int, tuple[ObservedSlice, SliceDevice]]:
        """The GPUs the driver publishes on ``node``, by index."""
        out: dict[int, tuple[ObservedSlice, SliceDevice]] = {}
        for s in sorted(self.slices.values(), key=lambda s: s.name):
            if s.node == node and s.driver == DRIVER:
                for dev in s.gpus:
                    out.setdefault(dev.index, (s, dev))
        return out

    def node_migs(self, node: str) -> list[tuple[ObservedSlice, MigDevice]]:
        """The MIG instances the driver publishes on ``node``."""
        return [
            (s, m)
            for s in sorted(self.slices.values(), key=lambda s: s.name)
            if s.node == node and s.driver == DRIVER
            for m in s.migs
        ]

    def shape(self) -> dict[str, tuple[object, ...]]:
        """Per node, the GPU indices and MIG instances published (a change rebuilds the
        model)."""
        nodes = {s.node for s in self.slices.values() if s.driver == DRIVER}
        return {
            n: (tuple(sorted(self.node_gpus(n))), tuple(m for _, m in self.node_migs(n)))
            for n in nodes
        }

    def held_by_others(self, ours: Collection[str]) -> dict[str, frozenset[int]]:
        """Per node, the GPU indices of devices allocated to claims none of ``ours`` (pod
        uids) holds: kube-scheduler's, or a claim allocated and not yet freed. The model leaves
        them out, so gpufence never allocates a device twice."""
        where = {
            (s.driver, s.pool, dev.name): (s.node, dev.index)
            for s in self.slices.values()
            for dev in s.gpus
        }
        held: dict[str, set[int]] = {}
        for claim in self.claims.values():
            if not claim.allocated or set(claim.reserved_for) & set(ours):
                continue
            for d in claim.allocated:
                found = where.get((d.driver, d.pool, d.device))
                if found is not None:
                    held.setdefault(found[0], set()).add(found[1])
        return {node: frozenset(ix) for node, ix in held.items()}

    def with_slice_gpus(self, node: ObservedNode) -> ObservedNode:
        """A node whose GPUs only its DRA slices show counts those: its GPUs, whole or cut
        into the MIG instances it publishes (counted by profile, as the device plugin's
        ``nvidia.com/mig-<profile>`` resources are)."""
        published, migs = self.node_gpus(node.name), [m for _, m in self.node_migs(node.name)]
        if node.gpus or node.mig or not (published or migs):
            return node
        gpus = len(set(published) | {m.parent for m in migs})
        return replace(node, gpus=gpus, mig=dict(Counter(m.profile for m in migs)))

    # -- pods -----------------------------------------------------------------------------------

    def view(self, pod: ObservedPod) -> tuple[ObservedPod, str]:
        """The pod with the GPUs its claims ask for (``claim_gpus``: a count, or what is wrong
        with them), and why it must wait ("" when it need not; a pod that waits reads as
        unreadable, never as zero GPUs)."""
        if not pod.claims:
            return pod, ""
        total = 0
        migs: list[str] = []
        for in_pod, claim_name in pod.claims:
            why = ""
            if not claim_name:
                why = f"waiting for the ResourceClaim of spec.resourceClaims {in_pod!r} "
                why += "(made from its template by the resource claim controller)"
            claim = self.claims.get(f"{pod.namespace}/{claim_name}")
            if claim is None:
                why = why or f"waiting for ResourceClaim {claim_name} (not seen yet)"
                return replace(pod, claim_gpus=why), why
            count = _claim_gpus(claim, pod.uid)
            if isinstance(count, str):
                return replace(pod, claim_gpus=count), ""
            total, migs = total + count[0], migs + count[1]
        if migs and (total or len(migs) > 1):
            why = f"ask for whole GPUs of {_CLASSES} or one MIG instance of {MIG_CLASS} (a pod "
            return replace(pod, claim_gpus=why + "takes one MIG instance: use a gang for more)"), ""
        if migs:
            return replace(pod, claim_gpus=1, claim_mig=migs[0]), ""
        if total <= 0:
            return replace(pod, claim_gpus="its ResourceClaims ask for no GPU"), ""
        return replace(pod, claim_gpus=total), ""

    def claim_writes(self, bind: BindPod, pod: ObservedPod) -> BindPod | str:
        """The bind with its claims' allocation: the GPUs the core planned for this pod, as
        the node's devices, request by request in the pod's claim order. A string: why the
        plan cannot be written (the node does not publish one of those GPUs)."""
        if not pod.claims:
            return bind
        member = next((m for m in bind.note.plan if m.pod == bind.pod), None)
        if member is None:
            return f"no plan for pod {bind.pod} in its bind note"
        published = self.node_gpus(bind.node)
        planned = list(member.gpus)
        writes: list[ClaimWrite] = []
        for _, claim_name in pod.claims:
            claim = self.claims.get(f"{pod.namespace}/{claim_name}")
            if claim is None:
                return f"ResourceClaim {claim_name} is gone"
            results: list[AllocatedDevice] = []
            for req in claim.requests:
                if req.mig_profile:
                    found_mig = self._mig_device(bind.node, member, req.mig_profile)
                    if isinstance(found_mig, str):
                        return found_mig
                    s, mig = found_mig
                    results.append(AllocatedDevice(req.name, s.driver, s.pool, mig.name))
                    continue
                for _ in range(req.count):
                    if not planned:
                        return f"the plan has fewer GPUs than ResourceClaim {claim_name} asks"
                    idx = planned.pop(0)
                    found = published.get(idx)
                    if found is None:
                        return (
                            f"node {bind.node} publishes no {DRIVER} GPU with index {idx} in "
                            "its ResourceSlices"
                        )
                    s, dev = found
                    results.append(AllocatedDevice(req.name, s.driver, s.pool, dev.name))
            already = bool(claim.allocated)  # (a roll-forward: only the reservation is added)
            writes.append(
                ClaimWrite(
                    pod.namespace,
                    claim.name,
                    claim.uid,
                    pod.name,
                    pod.uid,
                    bind.node,
                    () if already else tuple(results),
                )
            )
        return replace(bind, claims=tuple(writes))

    def _mig_device(
        self, node: str, member: MemberPlan, profile: str
    ) -> tuple[ObservedSlice, MigDevice] | str:
        """The MIG device the core's instance is: its GPU, profile and first memory slice."""
        if member.mig_profile != profile or member.mig_start is None or len(member.gpus) != 1:
            return f"the plan for pod {member.pod} is no {profile} MIG instance"
        want = (member.gpus[0], profile, member.mig_start)
        for s, m in self.node_migs(node):
            if (m.parent, m.profile, m.start) == want:
                return s, m
        return (
            f"node {node} publishes no {profile} MIG device on GPU {want[0]} at memory slice "
            f"{want[2]} in its ResourceSlices"
        )

    def releases(self, pod: ObservedPod) -> list[ClaimRelease]:
        """The pod ended or is gone: its claims are released (the claims of a template are
        deleted by the claim controller with the pod; a claim it named outlives it)."""
        return [ClaimRelease(pod.namespace, c, pod.uid) for _, c in pod.claims if c]


def _claim_gpus(claim: ObservedClaim, pod_uid: str) -> tuple[int, list[str]] | str:
    """Whole GPUs and MIG profiles one claim asks for, or what gpufence cannot honour in it
    (and the fix)."""
    what = f"ResourceClaim {claim.name}"
    if set(claim.reserved_for) - {pod_uid}:
        return f"{what} is in use by another pod: gpufence gives each claim to one pod at a time"
    if claim.constraints:
        return f"{what}: spec.devices.constraints are not honoured by gpufence; remove them"
    total = 0
    migs: list[str] = []
    for req in claim.requests:
        where = f"{what}, request {req.name}"
        if req.mode == "FirstAvailable":
            return f"{where}: firstAvailable is not read; ask exactly: {{deviceClassName: ...}}"
        if req.device_class == MIG_CLASS:
            if req.mode != "ExactCount" or not req.mig_profile:
                return (
                    f"{where}: DeviceClass {MIG_CLASS} -- name the profile with one selector, "
                    "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
                )
            migs += [req.mig_profile] * req.count
            continue
        if req.device_class not in GPU_CLASSES:
            return (
                f"{where}: DeviceClass {req.device_class!r} -- gpufence allocates whole GPUs of "
                f"DeviceClass {_CLASSES}"
            )
        if req.mode != "ExactCount":
            return f"{where}: allocationMode {req.mode} -- ask for ExactCount with a count"
        if req.selectors:
            return (
                f"{where}: CEL selectors are not evaluated by gpufence; choose the GPU type "
                "with the pod's nodeSelector nvidia.com/gpu.product"
            )
        total += req.count
    return total, migs
