"""The Kubernetes front end's pure half: fence files, pods -> jobs, nodes -> the model, and the
tracker's events and actions -- exact values, no API server (tests/k8s has the real one)."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufence.kube.actions import BindPod, DeletePod, ShowPending
from gpufence.kube.fences import fence_spec_from_dict
from gpufence.kube.hardware import Usage, build_hardware, gpu_type_of
from gpufence.kube.objects import ObservedNode, ObservedPod, Taint, quantity
from gpufence.kube.pods import PodAsk, PodProblem, read_pod
from gpufence.kube.tracker import Tracker
from gpufence.model.decisions import Reason
from gpufence.model.events import (
    JobCancelled,
    JobFinished,
    JobRestored,
    JobSubmitted,
    JobUpdated,
)
from gpufence.model.job import RequestKind, WorkloadClass
from gpufence.sched.scheduler import Scheduler
from gpufence.spec import SpecError

FENCES = {
    "name": "t",
    "partitions": {
        "serving": {"node_selector": {"fence": "serving"}, "admits": ["serving"]},
        "training": {"node_selector": {}, "admits": ["training", "batch"]},
    },
    "queues": [
        {"name": "online", "partition": "serving", "tenant": "team"},
        {"name": "research", "partition": "training", "tenant": "team"},
    ],
}


def node(name: str, gpus: int = 8, ready: bool = True, **labels: str) -> ObservedNode:
    base = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    return ObservedNode(name, {**base, **labels}, gpus, {}, 64000, 512 * 1024, ready)


def pod(
    name: str,
    gpus: int = 1,
    *,
    ns: str = "team",
    uid: str = "",
    phase: str = "Pending",
    node_name: str = "",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    deleting: bool = False,
) -> ObservedPod:
    return ObservedPod(
        namespace=ns,
        name=name,
        uid=uid or f"uid-{name}",
        scheduler_name="gpufence",
        node=node_name,
        phase=phase,
        deleting=deleting,
        labels=labels or {},
        annotations=annotations or {},
        requests={"nvidia.com/gpu": Decimal(gpus)},
        created=100.0,
    )


def gang(name: str, size: int, gpus: int = 1) -> list[ObservedPod]:
    ann = {"gpufence.io/gang-name": name, "gpufence.io/gang-size": str(size)}
    return [pod(f"{name}-{i}", gpus, annotations=ann) for i in range(size)]


# -- fence files ------------------------------------------------------------------------------


def test_fence_file_selectors_and_catch_all() -> None:
    spec = fence_spec_from_dict(FENCES)
    assert spec.partition_of({"fence": "serving"}) == ("serving", ["serving"])
    assert spec.partition_of({"fence": "other"}) == ("training", ["training"])


@pytest.mark.parametrize(
    ("change", "path", "words"),
    [
        ({"nodes": ["a"]}, "partitions.serving.nodes", "node_selector"),
        ({"node_selector": "fence=serving"}, "partitions.serving.node_selector", "mapping"),
        ({"node_selector": {"fence": "a b"}}, "partitions.serving.node_selector.fence", "label"),
        ({"sharing": "mug"}, "partitions.serving.sharing", "mug"),
    ],
)
def test_fence_file_errors_name_the_field(change: dict[str, object], path: str, words: str) -> None:
    data = {**FENCES, "partitions": {**FENCES["partitions"]}}  # type: ignore[dict-item]
    data["partitions"]["serving"] = {**FENCES["partitions"]["serving"], **change}  # type: ignore[index]
    with pytest.raises(SpecError) as err:
        fence_spec_from_dict(data)
    text = "\n".join(err.value.errors)
    assert path in text and words in text, text


def test_fence_file_refuses_node_groups_and_two_catch_alls() -> None:
    data = dict(FENCES, node_groups=[{"name": "a"}])
    data["partitions"] = {
        "a": {"node_selector": {}, "admits": ["training"]},
        "b": {"node_selector": {}, "admits": ["serving"]},
    }
    data["queues"] = []
    with pytest.raises(SpecError) as err:
        fence_spec_from_dict(data)
    text = "\n".join(err.value.errors)
    assert "node_groups" in text and "only one partition may take the unlabelled rest" in text


# -- nodes ------------------------------------------------------------------------------------


def test_nodes_become_the_model_sorted_with_foreign_usage_taken_off() -> None:
    spec = fence_spec_from_dict(FENCES)
    hw = build_hardware(
        spec,
        [node("b", 8), node("a", 4, fence="serving"), node("cpu-only", 0)],
        {"b": Usage(gpus=3, cpu_milli=1000)},
    )
    c = hw.cluster
    assert [(n.name, len(n.gpu_ids), n.group) for n in c.nodes] == [
        ("a", 4, "serving"),
        ("b", 5, "training"),
    ]
    assert c.nodes[1].cpu_milli == 63000
    assert c.nodes[0].gpu_type == "H100-80GB"
    assert len(c.partition_gpus["serving"]) == 4


def test_node_in_two_fences_is_left_out_with_a_reason() -> None:
    data = dict(FENCES)
    data["partitions"] = {
        "serving": {"node_selector": {"fence": "serving"}, "admits": ["serving"]},
        "training": {"node_selector": {"pool": "x"}, "admits": ["training"]},
    }
    hw = build_hardware(fence_spec_from_dict(data), [node("n", fence="serving", pool="x")])
    assert hw.cluster.nodes == ()
    assert hw.problems == ("node n: in no partition (its labels match serving, training)",)


def test_unknown_product_becomes_its_own_type() -> None:
    t = gpu_type_of(
        node("n", **{"nvidia.com/gpu.product": "Acme-X9", "nvidia.com/gpu.memory": "49152"})
    )
    assert (t.name, t.memory_gib, t.mig_model) == ("Acme-X9", 48.0, None)


def test_taints_and_quantities() -> None:
    assert quantity("500m") == Decimal("0.5") and quantity("64Gi") == 64 * 2**30
    with pytest.raises(ValueError, match="quantity"):
        quantity("lots")
    n = ObservedNode("n", {}, 8, {}, 1, 1, True, taints=(Taint("maint", "NoSchedule"),))
    from gpufence.kube.hardware import cordoned

    assert cordoned(n, ()) and not cordoned(n, ("maint",))


# -- pods -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "labels", "words"),
    [
        ({"gpufence.io/priority": "high"}, {}, "gpufence.io/priority"),
        ({"gpufence.io/priority": "٣"}, {}, "gpufence.io/priority"),
        ({"gpufence.io/checkpointable": "yes"}, {}, "gpufence.io/checkpointable"),
        ({"gpufence.io/est-runtime-s": "-5"}, {}, "est-runtime-s"),
        ({"gpufence.io/time-limit-s": "inf"}, {}, "time-limit-s"),
        ({"gpufence.io/gang-size": "4"}, {}, "gang-name"),
        ({"gpufence.io/gang-name": "x#2", "gpufence.io/gang-size": "2"}, {}, "not a name"),
        ({"gpufence.io/gang-name": "A" * 70, "gpufence.io/gang-size": "2"}, {}, "not a name"),
        ({"gpufence.io/gpu-fraction": "1.5"}, {}, "gpu-fraction"),
        ({}, {"gpufence.io/class": "gaming"}, "gpufence.io/class"),
        ({}, {"gpufence.io/queue": "nope"}, "no queue 'nope'"),
    ],
)
def test_bad_pods_are_refused_naming_the_key(
    annotations: dict[str, str], labels: dict[str, str], words: str
) -> None:
    spec = fence_spec_from_dict(FENCES)
    got = read_pod(pod("p", annotations=annotations, labels=labels), spec.policy.queues)
    assert isinstance(got, PodProblem) and words in got.message, got


def test_a_tenant_cannot_use_another_namespaces_queue() -> None:
    spec = fence_spec_from_dict(FENCES)
    got = read_pod(
        pod("p", ns="intruder", labels={"gpufence.io/queue": "research"}), spec.policy.queues
    )
    assert isinstance(got, PodProblem) and "belongs to tenant" in got.message


def test_pod_fields_become_the_job() -> None:
    spec = fence_spec_from_dict(FENCES)
    ann = {
        "gpufence.io/priority": "5",
        "gpufence.io/checkpointable": "true",
        "gpufence.io/est-runtime-s": "600",
        "gpufence.io/gpu-fraction": "0.25",
        "gpufence.io/gpu-memory-mib": "8000",
    }
    got = read_pod(
        pod("p", labels={"gpufence.io/class": "batch"}, annotations=ann), spec.policy.queues
    )
    assert isinstance(got, PodAsk)
    j = got.job
    assert (j.id, j.workload_class, j.priority, j.checkpointable, j.est_runtime_s, j.tenant) == (
        "team/p",
        WorkloadClass.BATCH,
        5,
        True,
        600.0,
        "team",
    )
    assert (j.request.kind, j.request.milli, j.request.gpu_mem_mib) == (
        RequestKind.FRACTION,
        250,
        8000,
    )


# -- the tracker ------------------------------------------------------------------------------


def _world() -> tuple[Tracker, Scheduler]:
    spec = fence_spec_from_dict(FENCES)
    hw = build_hardware(spec, [node("n0", 4), node("n1", 4)])
    return Tracker("gpufence", spec.policy.queues), Scheduler(hw.cluster)


def _cycle(t: Tracker, s: Scheduler, now: float) -> tuple[list[object], list[object]]:
    t.submit_ready()
    events, actions = t.take()
    t.decide(s.cluster, s.step(events, now), now)
    more_events, more_actions = t.take()
    if more_events:
        s.step(more_events, now)
    return [*events, *more_events], [*actions, *more_actions]


def test_gang_waits_for_all_its_pods_then_binds_whole() -> None:
    t, s = _world()
    members = gang("g", 3, gpus=2)
    for p in members[:2]:
        t.pod_seen(p)
    events, actions = _cycle(t, s, 1000.0)
    assert events == [] and actions == []
    assert t.waiting == {"team/@g": "waiting for the gang's pods: 2 of 3 exist"}
    t.pod_seen(members[2])
    events, actions = _cycle(t, s, 1001.0)
    assert [type(e) for e in events] == [JobSubmitted]
    binds = [a for a in actions if isinstance(a, BindPod)]
    assert sorted(b.pod for b in binds) == ["g-0", "g-1", "g-2"]
    assert {b.note.job_id for b in binds} == {"team/@g"}


def test_finish_cancel_and_recreated_pod_get_the_right_events() -> None:
    t, s = _world()
    t.pod_seen(pod("a", 1))
    _cycle(t, s, 1000.0)
    t.pod_seen(pod("a", 1, phase="Succeeded", node_name="n0"))
    events, _ = _cycle(t, s, 1001.0)
    assert events == [JobFinished("team/a", succeeded=True)]
    # a new pod under the old name (a StatefulSet's) is a new job, not a duplicate
    t.pod_gone("team/a")
    t.pod_seen(pod("a", 1, uid="uid-a2"))
    events, actions = _cycle(t, s, 1002.0)
    assert [e.job.id for e in events if isinstance(e, JobSubmitted)] == ["team/a#2"]
    assert [a.pod for a in actions if isinstance(a, BindPod)] == ["a"]


def test_a_failed_gang_member_stops_the_rest() -> None:
    t, s = _world()
    for p in gang("g", 2):
        t.pod_seen(p)
    _cycle(t, s, 1000.0)
    t.pod_seen(
        pod(
            "g-0",
            annotations={"gpufence.io/gang-name": "g", "gpufence.io/gang-size": "2"},
            phase="Failed",
            node_name="n0",
        )
    )
    _, actions = _cycle(t, s, 1001.0)
    assert [a.pod for a in actions if isinstance(a, DeletePod)] == ["g-1"]


def test_restore_rebuilds_running_jobs_and_rolls_a_half_gang_forward() -> None:
    t, s = _world()
    for p in gang("g", 2, gpus=2):
        t.pod_seen(p)
    _, actions = _cycle(t, s, 1000.0)
    binds = [a for a in actions if isinstance(a, BindPod)]
    first = binds[0]
    # a crash after the first bind: only g-0 is bound, carrying the note
    bound = pod(
        first.pod,
        2,
        node_name=first.node,
        annotations={
            **first.note.annotations(),
            "gpufence.io/gang-name": "g",
            "gpufence.io/gang-size": "2",
        },
    )
    other = pod(
        binds[1].pod, 2, annotations={"gpufence.io/gang-name": "g", "gpufence.io/gang-size": "2"}
    )
    t2, s2 = _world()
    t2.restore(s2.cluster, [bound, other])
    events, actions2 = t2.take()
    assert [type(e) for e in events] == [JobRestored]
    assert [(a.pod, a.node) for a in actions2 if isinstance(a, BindPod)] == [
        (binds[1].pod, binds[1].node)
    ]
    s2.step(events, 1001.0)
    assert s2.job("team/@g").state.value == "running"


def test_rejected_pod_is_shown_once_and_read_again_after_a_fix() -> None:
    t, s = _world()
    bad = pod("p", annotations={"gpufence.io/priority": "x"})
    t.pod_seen(bad)
    t.pod_seen(bad)
    _, actions = _cycle(t, s, 1000.0)
    assert [a.reason for a in actions if isinstance(a, ShowPending)] == ["gpufence/Rejected"]
    t.pod_seen(pod("p", annotations={"gpufence.io/priority": "3"}))
    events, _ = _cycle(t, s, 1001.0)
    assert [type(e) for e in events] == [JobSubmitted]


def test_a_pending_gang_losing_a_member_is_withdrawn() -> None:
    t, s = _world()
    t.pod_seen(pod("filler", 4))
    _cycle(t, s, 999.0)
    for p in gang("g", 2, gpus=4):  # one 4-GPU node is taken: it waits
        t.pod_seen(p)
    _cycle(t, s, 1000.0)
    assert s.job("team/@g").state.value == "pending"
    t.pod_gone("team/g-1")
    events, _ = _cycle(t, s, 1001.0)
    assert JobCancelled("team/@g") in events
    assert t.waiting == {"team/@g": "waiting for the gang's pods: 1 of 2 exist"}


# -- a property: no pod is ever bound twice, gangs are bound whole -------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["new", "gang", "done", "fail", "gone"]), st.integers(0, 30)),
        max_size=40,
    )
)
def test_no_pod_bound_twice_and_gangs_bound_whole(ops: list[tuple[str, int]]) -> None:
    t, s = _world()
    bound: dict[str, int] = {}
    live: dict[str, ObservedPod] = {}
    now = 1000.0
    for op, k in ops:
        now += 1
        if op == "new":
            p = pod(f"p{k}-{now:.0f}", 1 + k % 4)
            live[p.key] = p
            t.pod_seen(p)
        elif op == "gang":
            for p in gang(f"g{k}-{now:.0f}", 1 + k % 3, 1 + k % 2):
                live[p.key] = p
                t.pod_seen(p)
        elif live:
            key = sorted(live)[k % len(live)]
            p = live[key]
            if op == "gone":
                del live[key]
                t.pod_gone(key)
            elif p.key in bound:
                t.pod_seen(_ended(p, op))
        _, actions = _cycle(t, s, now)
        by_job: dict[str, list[str]] = {}
        for a in actions:
            if isinstance(a, BindPod):
                bound[f"{a.namespace}/{a.pod}"] = bound.get(f"{a.namespace}/{a.pod}", 0) + 1
                by_job.setdefault(a.note.job_id, []).append(a.pod)
                seen = _bound(live.get(f"{a.namespace}/{a.pod}"), a)
                live[seen.key] = seen
                t.pod_seen(seen)  # the watch shows the bind
        for job_id, pods in by_job.items():
            assert len(pods) == len(t.jobs[job_id].pods) if job_id in t.jobs else True
    assert all(n == 1 for n in bound.values()), bound


def _ended(p: ObservedPod, op: str) -> ObservedPod:
    from dataclasses import replace

    return replace(p, phase="Succeeded" if op == "done" else "Failed")


def _bound(p: ObservedPod | None, a: BindPod) -> ObservedPod:
    from dataclasses import replace

    assert p is not None
    return replace(p, node=a.node, annotations={**p.annotations, **a.note.annotations()})


def test_a_pod_the_core_rejected_is_not_submitted_again_on_its_next_update() -> None:
    t, s = _world()
    huge = pod("huge", 16)  # more GPUs than the fence has: the core rejects it
    t.pod_seen(huge)
    _, actions = _cycle(t, s, 1000.0)
    assert [a.reason for a in actions if isinstance(a, ShowPending)] == ["gpufence/Rejected"]
    t.pod_seen(huge)  # the watch shows our own condition write: nothing new to submit
    events, actions = _cycle(t, s, 1001.0)
    assert events == [] and actions == []


def test_mig_pods_land_on_mig_fences_and_a_layout_mismatch_is_named() -> None:
    data = {
        "name": "m",
        "partitions": {
            "mig": {
                "node_selector": {},
                "admits": ["batch"],
                "sharing": "mig",
                "mig": {"layout": ["3g.40gb", "1g.10gb@4", "1g.10gb@5", "1g.10gb@6"]},
            }
        },
        "queues": [{"name": "q", "partition": "mig", "tenant": "team"}],
    }
    spec = fence_spec_from_dict(data)
    good = ObservedNode(
        "m0",
        {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "2"},
        0,
        {"3g.40gb": 2, "1g.10gb": 6},
        64000,
        512 * 1024,
        True,
    )
    bad = ObservedNode("m1", good.labels, 0, {"1g.10gb": 14}, 64000, 512 * 1024, True)
    hw = build_hardware(spec, [good, bad])
    assert [len(n.gpu_ids) for n in hw.cluster.nodes] == [2, 2]
    assert hw.problems == (
        "node m1: offers MIG instances 1g.10gb=14, fence mig lays out 1g.10gb=6, 3g.40gb=2",
    )
    from dataclasses import replace

    mig_pod = replace(
        pod("p", labels={"gpufence.io/class": "batch"}),
        requests={"nvidia.com/mig-3g.40gb": Decimal(1)},
    )
    ask = read_pod(mig_pod, spec.policy.queues)
    assert isinstance(ask, PodAsk) and ask.job.request.mig_profile == "3g.40gb"
    t = Tracker("gpufence", spec.policy.queues)
    s = Scheduler(hw.cluster)
    t.pod_seen(ask.pod)
    _, actions = _cycle(t, s, 1000.0)
    (bind,) = [a for a in actions if isinstance(a, BindPod)]
    assert bind.note.plan[0].mig_profile == "3g.40gb"


def test_a_half_bound_gang_that_cannot_be_restored_is_rolled_back() -> None:
    t, s = _world()
    for p in gang("g", 2, gpus=2):
        t.pod_seen(p)
    _, actions = _cycle(t, s, 1000.0)
    first, second = [a for a in actions if isinstance(a, BindPod)]
    ann = {"gpufence.io/gang-name": "g", "gpufence.io/gang-size": "2"}
    bound = pod(first.pod, 2, node_name=first.node, annotations={**first.note.annotations(), **ann})
    other = pod(second.pod, 2, annotations=ann)
    # the restart finds a model without the planned nodes (they left the fence)
    spec = fence_spec_from_dict(FENCES)
    hw = build_hardware(spec, [node("elsewhere", 8)])
    t2 = Tracker("gpufence", spec.policy.queues)
    t2.restore(hw.cluster, [bound, other])
    events, actions2 = t2.take()
    assert events == []
    assert actions2 == [
        DeletePod("team", first.pod, "its gang cannot be restored where it was placed")
    ]


def test_topology_labels_racks_and_nvlink_domains() -> None:
    spec = fence_spec_from_dict({**FENCES, "kubernetes": {"rack_label": "example.com/rack"}})
    nodes = [
        node("a", 8, **{"example.com/rack": "r1", "gpufence.io/nvlink-domains": "4.4"}),
        node("b", 8, **{"topology.kubernetes.io/zone": "z2", "gpufence.io/nvlink-domains": "3.3"}),
        node("c", 8),
    ]
    c = build_hardware(spec, nodes).cluster
    assert [n.rack for n in c.nodes] == ["r1", "z2", "rack-0"]
    # "3.3" does not add up to 8 GPUs: one domain, as without the label
    assert [len(n.nvlink_domains) for n in c.nodes] == [2, 1, 1]
    assert c.nodes[0].nvlink_domains == ((0, 1, 2, 3), (4, 5, 6, 7))


def test_fence_file_errors_never_speak_of_the_virtual_nodes() -> None:
    with pytest.raises(SpecError) as err:
        fence_spec_from_dict({"name": "x", "partitions": {}})
    assert err.value.errors == ["partitions: must not be empty"]


def test_k8s_run_without_a_kubeconfig_says_so_without_a_traceback(tmp_path: object) -> None:
    from pathlib import Path

    from typer.testing import CliRunner

    from gpufence.cli.main import app

    config = Path(str(tmp_path)) / "cluster.yaml"
    config.write_text("name: x\npartitions:\n  all: {node_selector: {}, admits: [training]}\n")
    got = CliRunner().invoke(
        app, ["k8s", "run", "--config", str(config), "--kubeconfig", "/nonexistent/kubeconfig"]
    )
    assert got.exit_code == 2
    assert "cannot reach Kubernetes" in got.output and "--kubeconfig" in got.output
    assert "Traceback" not in got.output


def test_an_annotated_time_limit_or_priority_is_the_cores_update() -> None:
    """Issue 32 on Kubernetes: ``kubectl annotate`` of a member's time limit or priority is
    the same ``JobUpdated`` ``gpufence update`` sends; the core stops the pod at the new limit."""
    t, s = _world()
    limit = {"gpufence.io/time-limit-s": "600"}
    t.pod_seen(pod("a", 1, annotations=limit))
    _cycle(t, s, 1000.0)
    running = pod("a", 1, phase="Running", node_name="n0", annotations=limit)
    t.pod_seen(running)
    assert _cycle(t, s, 1001.0)[0] == []  # nothing changed: no update
    lowered = {"gpufence.io/time-limit-s": "5", "gpufence.io/priority": "-2"}
    t.pod_seen(replace(running, annotations=lowered))
    events, _ = _cycle(t, s, 1002.0)
    assert events == [JobUpdated("team/a", priority=-2, time_limit_s=5.0)]
    assert s.step([], 1004.0) == []
    stop = s.step([], 1005.0)
    assert [(d.job_id, d.reason) for d in stop] == [("team/a", Reason.TIME_LIMIT)]
    t.pod_seen(replace(running, annotations={"gpufence.io/time-limit-s": "soon"}))
    assert _cycle(t, s, 1006.0)[0] == []  # unreadable: nothing changes
