"""Exact devices through DRA (``resource.k8s.io/v1``), on a real API server: where a node's
GPUs are published as a ResourceSlice (the NVIDIA DRA driver's, faked by tests/k8s/dra_slices.py),
gpufence allocates each pod's ResourceClaim itself -- the GPUs the core chose (NVLink domain,
least fragmentation), written into the claim before the pod is bound -- and releases it when
the pod ends."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dra_slices as d
import kobjects as k
import pytest
from cluster import KubeCluster
from kenv import FENCED, Env

NVLINK = "gpufence.io/nvlink-domains"


def _dra_node(env: Env, gpus: int = 8, domains: str = "4.4", seed: int = 0) -> str:
    """A training node whose GPUs only its ResourceSlice shows (no nvidia.com/gpu), in two
    NVLink domains of four."""
    labels = {"test.gpufence.io/run": env.run, "gpufence.io/fence": "training", NVLINK: domains}
    node = k.gpu_node(env.kc, f"{env.run}-dra-{secrets.token_hex(2)}", gpus=0, labels=labels)
    d.device_class(env.kc)
    d.gpu_slice(env.kc, node, gpus, seed=seed)
    return node


def _gpus_of(env: Env, pod: str) -> list[int]:
    note = k.get_pod(env.kc, env.ns, pod)["metadata"]["annotations"]["gpufence.io/gpus"]
    return [int(g) for g in note.split(",")]


def _bound_with_claim(env: Env, pod: str, claim: str) -> tuple[str, dict[str, object]]:
    """Wait for the bind; the claim, read right after, is already allocated (it is written
    before the bind)."""
    node = env.bound(pod, timeout=30)
    return node, d.get_claim(env.kc, env.ns, claim)


def test_k8s_dra_claim_gets_the_gpus_the_core_chose(env: Env) -> None:
    node = _dra_node(env)
    env.start().wait_ready()
    # 3 GPUs in use: NVLink domain 0 keeps one free GPU (3), domain 1 four (4-7)
    d.claim(env.kc, env.ns, "first", 3)
    d.dra_pod(env.kc, env.ns, "first", env.sched, claim_name="first")
    bound, first = _bound_with_claim(env, "first", "first")
    assert bound == node
    assert _gpus_of(env, "first") == [0, 1, 2]
    assert d.allocated(first) == [f"{node}/gpu-0", f"{node}/gpu-1", f"{node}/gpu-2"]
    # the pair goes to one NVLink domain, not GPUs 3+4 across both (what any-two-free gives)
    d.claim(env.kc, env.ns, "pair", 2)
    d.dra_pod(env.kc, env.ns, "pair", env.sched, claim_name="pair")
    bound, pair = _bound_with_claim(env, "pair", "pair")
    assert bound == node
    chosen = _gpus_of(env, "pair")
    assert chosen in ([4, 5], [6, 7]), chosen
    assert d.allocated(pair) == sorted(f"{node}/gpu-{i}" for i in chosen), pair
    # the binding follows the allocation: its node, the pod reserved, the claim protected, and
    # written first (resourceVersions are etcd's revisions on this harness: the claim's last
    # write is older than the bind, the pod's last write)
    pod_rv = k.get_pod(env.kc, env.ns, "pair")["metadata"]["resourceVersion"]
    assert int(pair["metadata"]["resourceVersion"]) < int(pod_rv), (pair["metadata"], pod_rv)
    assert d.allocated_node(pair) == node
    assert d.reserved_for(pair) == ["pair"]
    assert "resource.kubernetes.io/delete-protection" in pair["metadata"]["finalizers"]


def test_k8s_dra_claim_is_released_when_its_pod_ends(env: Env) -> None:
    _dra_node(env, gpus=4, domains="4")
    env.start().wait_ready()
    d.claim(env.kc, env.ns, "job", 4)
    d.dra_pod(env.kc, env.ns, "job", env.sched, claim_name="job")
    _, claim = _bound_with_claim(env, "job", "job")
    assert len(d.allocated(claim)) == 4
    k.set_phase(env.kc, env.ns, "job", "Succeeded")

    def released() -> bool:
        c = d.get_claim(env.kc, env.ns, "job")
        status = c.get("status") or {}
        finalizers = c["metadata"].get("finalizers") or []
        return not status.get("allocation") and not status.get("reservedFor") and not finalizers

    k.wait("the claim released", released, timeout=20)
    # its GPUs are free again: the next pod with the same claim gets them
    d.dra_pod(env.kc, env.ns, "again", env.sched, claim_name="job")
    _, claim = _bound_with_claim(env, "again", "job")
    assert d.reserved_for(claim) == ["again"] and len(d.allocated(claim)) == 4


def test_k8s_dra_restart_keeps_the_claimed_gpus_held(env: Env) -> None:
    node = _dra_node(env)
    first_proc = env.start()
    first_proc.wait_ready()
    d.claim(env.kc, env.ns, "first", 3)
    d.dra_pod(env.kc, env.ns, "first", env.sched, claim_name="first")
    env.bound("first", timeout=30)
    k.set_phase(env.kc, env.ns, "first", "Running")
    first_proc.kill()
    env.start().wait_ready()  # restores "first" from its note and its claim
    d.claim(env.kc, env.ns, "pair", 2)
    d.dra_pod(env.kc, env.ns, "pair", env.sched, claim_name="pair")
    _, pair = _bound_with_claim(env, "pair", "pair")
    chosen = _gpus_of(env, "pair")
    assert chosen in ([4, 5], [6, 7]), chosen  # not GPUs 0-2, which "first" still holds
    assert d.allocated(pair) == sorted(f"{node}/gpu-{i}" for i in chosen), pair
    assert d.allocated(d.get_claim(env.kc, env.ns, "first")) == [
        f"{node}/gpu-{i}" for i in (0, 1, 2)
    ]


def test_k8s_dra_gang_members_each_get_their_own_devices(env: Env) -> None:
    node = _dra_node(env)
    env.start().wait_ready()
    gang = {"gpufence.io/gang-name": "g", "gpufence.io/gang-size": "2"}
    for m in ("g-0", "g-1"):
        d.claim(env.kc, env.ns, m, 4)
        d.dra_pod(env.kc, env.ns, m, env.sched, annotations=gang, claim_name=m)
    devices = []
    for m in ("g-0", "g-1"):
        assert _bound_with_claim(env, m, m)[0] == node
        claim = d.get_claim(env.kc, env.ns, m)
        assert d.allocated(claim) == sorted(f"{node}/gpu-{i}" for i in _gpus_of(env, m)), claim
        assert d.reserved_for(claim) == [m]
        devices += d.allocated(claim)
    assert sorted(devices) == sorted(f"{node}/gpu-{i}" for i in range(8))  # one NVLink domain each


def test_k8s_dra_devices_another_scheduler_allocated_are_never_allocated_again(env: Env) -> None:
    node = _dra_node(env)
    # a pod kube-scheduler placed, whose claim holds GPUs 0 and 1
    d.claim(env.kc, env.ns, "theirs", 2)
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "theirs"},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpus"}]}}
            ],
            **d.claims_spec(claim_name="theirs"),
        },
    }
    theirs = k.ok(env.kc, "POST", f"/api/v1/namespaces/{env.ns}/pods", body, 201)
    d.allocate_as_another_scheduler(env.kc, env.ns, "theirs", node, [0, 1], theirs)
    proc = env.start()
    proc.wait_ready()
    d.claim(env.kc, env.ns, "pair", 2)
    d.dra_pod(env.kc, env.ns, "pair", env.sched, claim_name="pair")
    _, pair = _bound_with_claim(env, "pair", "pair")
    chosen = _gpus_of(env, "pair")
    # the rest of their NVLink domain (best fit), never their GPUs
    assert chosen == [2, 3], chosen
    assert d.allocated(pair) == [f"{node}/gpu-2", f"{node}/gpu-3"], pair
    # they take GPUs 4 and 5 while gpufence runs: the model is rebuilt around them, "pair"
    # restored on its own GPUs 2 and 3 (by index), and the next pair gets 6 and 7
    d.claim(env.kc, env.ns, "more", 2)
    more = k.ok(env.kc, "POST", f"/api/v1/namespaces/{env.ns}/pods", _named(body, "more"), 201)
    models = proc.log_path_text().count("cluster model:")
    d.allocate_as_another_scheduler(env.kc, env.ns, "more", node, [4, 5], more)
    k.wait("the model rebuilt", lambda: proc.log_path_text().count("cluster model:") > models)
    d.claim(env.kc, env.ns, "last", 2)
    d.dra_pod(env.kc, env.ns, "last", env.sched, claim_name="last")
    _, last = _bound_with_claim(env, "last", "last")
    assert _gpus_of(env, "last") == [6, 7]
    assert d.allocated(last) == [f"{node}/gpu-6", f"{node}/gpu-7"], last


def _named(pod: dict[str, Any], name: str) -> dict[str, Any]:
    claims = [{"name": "gpus", "resourceClaimName": name}]
    return {**pod, "metadata": {"name": name}, "spec": {**pod["spec"], "resourceClaims": claims}}


def test_k8s_dra_claim_no_node_can_satisfy_says_why_with_numbers(env: Env) -> None:
    _dra_node(env)
    env.start().wait_ready()
    d.claim(env.kc, env.ns, "huge", 16)
    d.dra_pod(env.kc, env.ns, "huge", env.sched, claim_name="huge")
    cond = k.wait(
        "a reason", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, "huge")), timeout=30
    )
    assert cond["reason"] == "gpufence/Rejected", cond
    assert "needs 16 GPUs on one node; nodes of training have at most 8" in cond["message"], cond
    assert not k.node_of(env.kc, env.ns, "huge")
    assert not d.allocated(d.get_claim(env.kc, env.ns, "huge"))
    # a claim for another DeviceClass is refused, naming it and the class gpufence allocates
    d.claim(env.kc, env.ns, "nic", 1, device_class="nic.example.com")
    d.dra_pod(env.kc, env.ns, "nic", env.sched, claim_name="nic")
    cond = k.wait(
        "a rejection", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, "nic")), timeout=30
    )
    assert cond["reason"] == "gpufence/Rejected", cond
    assert "DeviceClass 'nic.example.com'" in cond["message"], cond
    assert "gpu.nvidia.com" in cond["message"], cond


def test_k8s_dra_pod_waits_for_its_claim_saying_so(env: Env) -> None:
    node = _dra_node(env, gpus=4, domains="4")
    env.start().wait_ready()
    d.dra_pod(env.kc, env.ns, "early", env.sched, claim_name="later")
    cond = k.wait(
        "a reason", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, "early")), timeout=30
    )
    assert cond["message"] == "waiting for ResourceClaim later (not seen yet)", cond
    d.claim(env.kc, env.ns, "later", 1)
    _, claim = _bound_with_claim(env, "early", "later")
    assert d.allocated(claim) == [f"{node}/gpu-0"]


MIG_FENCED = """
name: k8s-dra-mig
kubernetes: {{scheduler_name: {sched}}}
partitions:
  mig:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: mig}}
    admits: [batch]
    sharing: mig
    mig: {{layout: [3g.40gb, 1g.10gb@4, 1g.10gb@5, 1g.10gb@6]}}
queues:
  - {{name: evals, partition: mig, tenant: ns-{run}}}
"""


def test_k8s_dra_mig_claim_gets_the_instance_the_core_chose(env: Env) -> None:
    env.config.write_text(MIG_FENCED.format(run=env.run, sched=env.sched))
    labels = {"test.gpufence.io/run": env.run, "gpufence.io/fence": "mig"}
    node = k.gpu_node(env.kc, f"{env.run}-mig-{secrets.token_hex(2)}", gpus=0, labels=labels)
    d.device_class(env.kc)
    layout = [(0, "3g.40gb", 0), (0, "1g.10gb", 4), (0, "1g.10gb", 5), (0, "1g.10gb", 6)]
    d.mig_slice(env.kc, node, layout)
    env.start().wait_ready()
    batch = {"gpufence.io/class": "batch"}
    starts = []
    for name, profile in (("small", "1g.10gb"), ("small2", "1g.10gb"), ("big", "3g.40gb")):
        d.mig_claim(env.kc, env.ns, name, profile)
        d.dra_pod(env.kc, env.ns, name, env.sched, labels=batch, claim_name=name)
        assert env.bound(name, timeout=30) == node
        claim = d.get_claim(env.kc, env.ns, name)
        ann = k.get_pod(env.kc, env.ns, name)["metadata"]["annotations"]
        (plan,) = json.loads(ann["gpufence.io/gang-plan"])
        assert plan["mig"] == profile, plan
        gi, size = d.MIG_PROFILES[profile]
        want = f"{node}/gpu-0-mig-{gi}-{plan['start']}-{size}"
        assert d.allocated(claim) == [want], claim
        assert d.reserved_for(claim) == [name]
        starts.append(plan["start"])
    assert len(set(starts)) == 3, starts  # three instances, each its own device


@pytest.fixture(scope="module")
def controlled(
    k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeCluster]:
    """An API server of this module's own with kube-controller-manager, whose resource claim
    controller makes a pod's claims from its ResourceClaimTemplates."""
    kc = KubeCluster(k8s_bin_dir, tmp_path_factory.mktemp("k8s-dra"))
    kc.start()
    try:
        kc.start_controllers()
        yield kc
    finally:
        kc.close()


@pytest.fixture
def cenv(controlled: KubeCluster, tmp_path: Path) -> Iterator[Env]:
    run = f"r{secrets.token_hex(3)}"
    sched = f"gpufence-{run}"
    config = tmp_path / "cluster.yaml"
    config.write_text(FENCED.format(run=run, sched=sched))
    e = Env(controlled, k.namespace(controlled, f"ns-{run}"), run, sched, config, tmp_path, [])
    try:
        yield e
    finally:
        for p in e.procs:
            p.stop()


def test_k8s_dra_pod_with_a_claim_template_gets_the_claim_the_controller_made(cenv: Env) -> None:
    env = cenv
    node = _dra_node(env)
    env.start().wait_ready()
    d.claim(env.kc, env.ns, "first", 3)
    d.dra_pod(env.kc, env.ns, "first", env.sched, claim_name="first")
    env.bound("first", timeout=30)
    d.claim_template(env.kc, env.ns, "two-gpus", 2)
    d.dra_pod(env.kc, env.ns, "pair", env.sched, template="two-gpus")

    def made() -> str:
        statuses = k.get_pod(env.kc, env.ns, "pair").get("status", {}).get("resourceClaimStatuses")
        return str((statuses or [{}])[0].get("resourceClaimName") or "")

    claim = k.wait("the controller's claim", made, timeout=30)
    assert env.bound("pair", timeout=30) == node
    chosen = _gpus_of(env, "pair")
    assert chosen in ([4, 5], [6, 7]), chosen
    pair = d.get_claim(env.kc, env.ns, claim)
    assert d.allocated(pair) == sorted(f"{node}/gpu-{i}" for i in chosen), pair
    assert d.reserved_for(pair) == ["pair"]
