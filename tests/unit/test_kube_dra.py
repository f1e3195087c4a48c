"""DRA's pure half (kube/dra.py, kube/dra_objects.py): ResourceSlices and ResourceClaims read
from the API's objects, a pod's claims read into its GPU request, the core's GPU indices
written as the node's devices -- exact values, no API server (tests/k8s/test_k8s_dra.py has
the real one)."""

from __future__ import annotations

from dataclasses import replace

from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from gpufence.kube.actions import BindPod
from gpufence.kube.dra import DraBook
from gpufence.kube.dra_objects import (
    AllocatedDevice,
    ClaimRelease,
    ClaimWrite,
    observe_claim,
    observe_slice,
)
from gpufence.kube.fences import fence_spec_from_dict
from gpufence.kube.hardware import Usage, build_hardware
from gpufence.kube.objects import ObservedNode, ObservedPod
from gpufence.kube.placement_notes import BindNote, MemberPlan, assignments_of
from gpufence.kube.pods import PodAsk, PodProblem, read_pod
from gpufence.model.job import GpuRequest


def _slice(node: str, order: list[int], qualified: bool = False) -> ResourceSlice:
    key = "gpu.nvidia.com/" if qualified else ""
    devices = [
        {"name": f"gpu-{i}", "attributes": {f"{key}index": {"int": i}, "type": {"string": "gpu"}}}
        for i in order
    ]
    devices.append(  # a MIG device is not a whole GPU
        {"name": "gpu-0-mig-1g", "attributes": {"index": {"int": 0}, "type": {"string": "mig"}}}
    )
    return ResourceSlice.from_dict(
        {
            "metadata": {"name": f"{node}-slice"},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": node,
                "pool": {"name": f"pool-{node}", "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        }
    )


def _claim(name: str, count: int, cls: str = "gpu.nvidia.com", **extra: object) -> ResourceClaim:
    exactly = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count, **extra}
    return ResourceClaim.from_dict(
        {
            "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}},
        }
    )


def _pod(*claims: tuple[str, str], uid: str = "p1") -> ObservedPod:
    return ObservedPod("team", "p", uid, "gpufence", "", "Pending", False, {}, {}, claims=claims)


def _book() -> DraBook:
    book = DraBook()
    for obj in (_slice("n1", [5, 2, 7, 0, 3, 6, 1, 4]),):
        s = observe_slice(obj)
        book.slices[s.name] = s
    for obj in (_claim("a", 2), _claim("b", 1), _claim("nic", 1, "nic.example.com")):
        c = observe_claim(obj)
        book.claims[c.key] = c
    return book


def test_a_slice_reads_its_whole_gpus_by_index() -> None:
    s = observe_slice(_slice("n1", [3, 1, 0, 2], qualified=True))
    assert [(d.index, d.name) for d in s.gpus] == [(i, f"gpu-{i}") for i in range(4)]
    assert (s.node, s.driver, s.pool) == ("n1", "gpu.nvidia.com", "pool-n1")


def test_a_gpu_without_an_index_attribute_is_named_by_its_minor() -> None:
    # the driver's later releases: "gpu-<minor>", no index attribute; or a minor attribute
    raw = _slice("n1", [0]).to_dict()
    raw["spec"]["devices"] = [
        {"name": "gpu-3", "attributes": {"type": {"string": "gpu"}}},
        {"name": "gpu-a", "attributes": {"type": {"string": "gpu"}, "minor": {"int": 1}}},
        {"name": "gpu-3-mig-19-0-1", "attributes": {"type": {"string": "mig"}}},
        {"name": "gpu-vfio-0", "attributes": {"type": {"string": "vfio"}}},
    ]
    s = observe_slice(ResourceSlice.from_dict(raw))
    assert [(d.index, d.name) for d in s.gpus] == [(1, "gpu-a"), (3, "gpu-3")]


def test_a_node_publishing_only_slices_counts_their_gpus() -> None:
    book = _book()
    bare = ObservedNode("n1", {}, 0, {}, 64000, 1024, True)
    assert book.with_slice_gpus(bare).gpus == 8
    plugin = ObservedNode("n2", {}, 4, {}, 64000, 1024, True)
    assert book.with_slice_gpus(plugin) == plugin


def test_claims_are_read_into_whole_gpus_or_keep_the_pod_waiting() -> None:
    book = _book()
    view, why = book.view(_pod(("x", "a"), ("y", "b")))
    assert (view.claim_gpus, why) == (3, "")
    ask = read_pod(view, {})
    assert isinstance(ask, PodAsk) and ask.job.request == GpuRequest.whole(3)
    _, why = book.view(_pod(("x", "")))
    assert why.startswith("waiting for the ResourceClaim of spec.resourceClaims 'x'")
    waiting, why = book.view(_pod(("x", "ghost")))
    assert why == "waiting for ResourceClaim ghost (not seen yet)"
    # (a bound pod whose claim is not seen reads as unreadable, never as a job of 0 GPUs)
    assert read_pod(waiting, {}) == PodProblem("team/p", why)


def test_a_claim_gpufence_cannot_honour_refuses_the_pod_naming_it() -> None:
    book = _book()
    view, _ = book.view(_pod(("x", "nic")))
    problem = read_pod(view, {})
    assert isinstance(problem, PodProblem)
    assert problem.message == (
        "ResourceClaim nic, request gpus: DeviceClass 'nic.example.com' -- gpufence allocates "
        "whole GPUs of DeviceClass gpu.nvidia.com"
    )
    c = observe_claim(_claim("cel", 1, selectors=[{"cel": {"expression": "true"}}]))
    book.claims[c.key] = c
    view, _ = book.view(_pod(("x", "cel")))
    assert "CEL selectors are not evaluated" in str(view.claim_gpus)
    held = observe_claim(_claim("a", 2))
    book.claims[held.key] = replace(held, reserved_for=("other",))
    view, _ = book.view(_pod(("x", "a")))
    assert "in use by another pod" in str(view.claim_gpus)


def test_the_core_s_gpu_indices_become_the_node_s_devices_claim_by_claim() -> None:
    book = _book()
    pod = _pod(("x", "a"), ("y", "b"))
    note = BindNote("team/p", "training", None, 1, 0.0, (MemberPlan("p", "n1", (4, 5, 6)),))
    bind = book.claim_writes(BindPod("team", "p", "n1", note), pod)
    assert isinstance(bind, BindPod)

    def devices(*idx: int) -> tuple[AllocatedDevice, ...]:
        return tuple(AllocatedDevice("gpus", "gpu.nvidia.com", "pool-n1", f"gpu-{i}") for i in idx)

    assert bind.claims == (
        ClaimWrite("team", "a", "uid-a", "p", "p1", "n1", devices(4, 5)),
        ClaimWrite("team", "b", "uid-b", "p", "p1", "n1", devices(6)),
    )
    assert book.releases(pod) == [
        ClaimRelease("team", "a", "p1"),
        ClaimRelease("team", "b", "p1"),
    ]
    # a GPU the node does not publish: no bind, and why
    far = BindNote("team/p", "training", None, 1, 0.0, (MemberPlan("p", "n1", (8, 9, 10)),))
    why = book.claim_writes(BindPod("team", "p", "n1", far), pod)
    assert why == "node n1 publishes no gpu.nvidia.com GPU with index 8 in its ResourceSlices"


def test_devices_others_hold_are_left_out_of_the_model_by_index() -> None:
    book = _book()
    held = observe_claim(_claim("theirs", 2))
    held = replace(
        held,
        allocated=tuple(
            AllocatedDevice("gpus", "gpu.nvidia.com", "pool-n1", f"gpu-{i}") for i in (0, 1)
        ),
        reserved_for=("their-pod",),
    )
    book.claims[held.key] = held
    assert book.held_by_others({"our-pod"}) == {"n1": frozenset({0, 1})}
    assert book.held_by_others({"their-pod"}) == {}  # (a pod of ours holds it: the core knows)
    fences = fence_spec_from_dict(
        {"name": "t", "partitions": {"training": {"node_selector": {}, "admits": ["training"]}}}
    )
    n1 = ObservedNode("n1", {"gpufence.io/nvlink-domains": "4.4"}, 0, {}, 64000, 1024, True)
    hw = build_hardware(
        fences, [book.with_slice_gpus(n1)], {"n1": Usage(devices=frozenset({0, 1}))}
    )
    (node,) = hw.cluster.nodes
    assert [hw.cluster.gpus[g].index for g in node.gpu_ids] == [2, 3, 4, 5, 6, 7]
    assert node.nvlink_domains == ((2, 3), (4, 5, 6, 7))
    plan = (MemberPlan("p", "n1", (3, 6)),)
    (a,) = assignments_of(hw.cluster, plan) or ()
    assert [hw.cluster.gpus[g].index for g in a.gpus] == [3, 6]
    assert assignments_of(hw.cluster, (MemberPlan("p", "n1", (0,)),)) is None


def test_mig_devices_and_claims_are_read_by_profile_parent_and_start() -> None:
    raw = _slice("n1", [0]).to_dict()
    raw["spec"]["devices"] = [
        {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "U0"}}},
        {
            "name": "odd-name",  # parent by parentUUID, start by its memory slices
            "attributes": {
                "type": {"string": "mig"},
                "profile": {"string": "3g.40gb"},
                "parentUUID": {"string": "U0"},
            },
            "capacity": {f"memorySlice{i}": {"value": "1"} for i in (4, 5, 6, 7)},
        },
        {
            "name": "gpu-1-mig-19-2-1",
            "attributes": {"type": {"string": "mig"}, "profile": {"string": "1g.10gb"}},
        },
    ]
    s = observe_slice(ResourceSlice.from_dict(raw))
    assert [(m.name, m.parent, m.profile, m.start) for m in s.migs] == [
        ("odd-name", 0, "3g.40gb", 4),
        ("gpu-1-mig-19-2-1", 1, "1g.10gb", 2),
    ]
    book = DraBook()
    book.take_slices([s])
    n1 = ObservedNode("n1", {}, 0, {}, 64000, 1024, True)
    assert book.with_slice_gpus(n1).mig == {"3g.40gb": 1, "1g.10gb": 1}
    assert book.with_slice_gpus(n1).gpus == 2
    sel = [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"}}]
    book.take_claims(
        observe_claim(c)
        for c in (
            _claim("m", 1, "mig.nvidia.com", selectors=sel),
            _claim("m2", 1, "mig.nvidia.com", selectors=sel),
            _claim("any", 1, "mig.nvidia.com"),
            _claim("a", 2),
        )
    )
    view, _ = book.view(_pod(("x", "m")))
    ask = read_pod(view, {})
    assert isinstance(ask, PodAsk) and ask.job.request == GpuRequest.mig("3g.40gb")
    note = BindNote(
        "team/p", "mig", None, 1, 0.0, (MemberPlan("p", "n1", (0,), 1000, 0, "3g.40gb", 4),)
    )
    bind = book.claim_writes(BindPod("team", "p", "n1", note), view)
    assert isinstance(bind, BindPod)
    assert bind.claims[0].devices == (
        AllocatedDevice("gpus", "gpu.nvidia.com", "pool-n1", "odd-name"),
    )
    for claims, says in (
        ((("x", "any"),), "name the profile with one selector"),
        ((("x", "m"), ("y", "m2")), "a pod takes one MIG instance"),
        ((("x", "m"), ("y", "a")), "ask for whole GPUs of gpu.nvidia.com or one MIG instance"),
    ):
        view, _ = book.view(_pod(*claims))
        assert says in str(view.claim_gpus), view.claim_gpus
