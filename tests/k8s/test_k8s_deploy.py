"""deploy/ on a real kube-apiserver: every document applies (and applies again), the CRDs show
who holds what the way ``kubectl get`` prints it, the ConfigMap's cluster YAML validates, and the
real scheduler runs under nothing but deploy/'s RBAC -- it binds a gang and a serving Deployment's
pods, writes a pending reason and an Event, stops the rest of a failed gang and holds its lease,
with no 403 -- while everything it does not need stays forbidden.

The scheduler here runs as the harness user ``gpufence-scheduler`` (no grants of its own), bound
to deploy/'s ClusterRole and lease Role for the test; the ServiceAccount of deploy/ has no token
in this harness (no controller-manager), so the user stands in for it.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import re
import secrets
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kapply
import kobjects as k
import play
import pytest
import yaml
from cluster import GPUFENCE_SCHEDULER_USER, KubeCluster
from kenv import Env
from mig_manager import FakeMigManager
from scheduler_proc import SchedulerProc
from test_k8s_mig import MIG_FENCE, mig_node, mig_pod

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
EXAMPLES = REPO / "examples" / "k8s"
NS = "gpufence-system"
MIG_NS = "gpu-operator"  # deploy/mig/: the GPU operator's namespace, where its ConfigMap lives
RBAC = "/apis/rbac.authorization.k8s.io/v1"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"deploy/ has {len(found)} {kind} {name or ''}"
    return found[0]


@pytest.fixture(scope="module")
def deployed(k8s_cluster: KubeCluster) -> list[dict[str, Any]]:
    """deploy/ applied twice: the second pass replaces what the first created, as a re-apply
    after an upgrade would."""
    docs = kapply.documents(DEPLOY)
    kapply.apply_all(k8s_cluster, docs)
    kapply.apply_all(k8s_cluster, docs)
    return docs


def test_k8s_deploy_every_document_is_served(
    k8s_cluster: KubeCluster, deployed: list[dict[str, Any]]
) -> None:
    kinds = sorted({d["kind"] for d in deployed})
    assert kinds == sorted(
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "CustomResourceDefinition",
            "Deployment",
            "Namespace",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
    )
    # numbered files: every namespaced object comes after its Namespace, every kind after its CRD
    first = [d["kind"] for d in deployed][:2]
    assert first == ["Namespace", "CustomResourceDefinition"]
    for doc in deployed:
        stored = k.ok(k8s_cluster, "GET", kapply.object_path(k8s_cluster, doc))
        assert stored["metadata"]["name"] == doc["metadata"]["name"]
    dep = k.ok(k8s_cluster, "GET", f"/apis/apps/v1/namespaces/{NS}/deployments/gpufence-scheduler")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"][:3] == ["gpufence", "k8s", "run"]
    assert "--no-leader-elect" not in c["command"]  # leader election is on by default
    assert c["image"].startswith("ghcr.io/gpufence/gpufence:")
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["serviceAccountName"] == "gpufence-scheduler"


def test_k8s_deploy_configmap_is_a_valid_cluster_yaml_where_the_deployment_reads_it(
    deployed: list[dict[str, Any]], tmp_path: Path
) -> None:
    cm = _one(deployed, "ConfigMap")
    dep = _one(deployed, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    config_path = command[command.index("--config") + 1]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    (vol,) = [v for v in pod["volumes"] if v.get("configMap")]
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    key = config_path.removeprefix(mounts[vol["name"]] + "/")
    assert key in cm["data"], f"{config_path}: the ConfigMap has no key {key}"
    path = tmp_path / key
    path.write_text(cm["data"][key])
    proc = subprocess.run(
        [sys.executable, "-m", "gpufence", "k8s", "validate", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for fence in ("serving", "training", "interactive"):
        assert f"partition {fence}: nodes labelled gpufence.io/fence={fence}" in proc.stdout


def _table(kc: KubeCluster, path: str) -> tuple[list[str], list[list[Any]]]:
    """What ``kubectl get`` prints: the server-side Table of a list (the Accept header kubectl
    sends), its default columns only (priority 0; -o wide adds the others)."""
    ctx = ssl.create_default_context(cafile=str(kc.ca_file))
    conn = http.client.HTTPSConnection("127.0.0.1", kc.port, context=ctx, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {kc.admin_token}", "Accept": TABLE}
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        status, body = resp.status, json.loads(resp.read())
    finally:
        conn.close()
    assert status == 200, body
    shown = [c.get("priority", 0) == 0 for c in body["columnDefinitions"]]
    cols = [c["name"] for c, s in zip(body["columnDefinitions"], shown, strict=True) if s]
    rows = [[v for v, s in zip(r["cells"], shown, strict=True) if s] for r in body["rows"]]
    return cols, rows


def test_k8s_deploy_crds_print_who_holds_what(
    k8s_cluster: KubeCluster, deployed: list[dict[str, Any]]
) -> None:
    kc, run = k8s_cluster, secrets.token_hex(3)
    base = "/apis/gpufence.io/v1alpha1"
    fence = {
        "apiVersion": "gpufence.io/v1alpha1",
        "kind": "Fence",
        "metadata": {"name": f"training-{run}"},
        "spec": {
            "nodeSelector": {"gpufence.io/fence": "training"},
            "admits": ["training", "batch"],
            "sharing": "exclusive",
            "preemption": {"mode": "off"},  # any partition field is kept
        },
    }
    queue = {
        "apiVersion": "gpufence.io/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": f"vision-{run}"},
        "spec": {"partition": f"training-{run}", "tenant": "vision", "nominalGPUs": 8},
    }
    made = [kapply.apply(kc, fence), kapply.apply(kc, queue)]
    try:
        assert made[0]["spec"]["preemption"] == {"mode": "off"}
        f_status = {
            "capacityGPUs": 16,
            "usedGPUs": 9.5,
            "lentGPUs": 2,
            "borrowedGPUs": 0,
            "pending": 3,
            "running": 4,
            "nodes": 2,
            "largestGang": 4,
        }
        q_status = {"usedGPUs": 10, "borrowedGPUs": 2, "pending": 1, "running": 3}
        for i, (st, plural) in enumerate(((f_status, "fences"), (q_status, "queues"))):
            path = f"{base}/{plural}/{made[i]['metadata']['name']}/status"
            made[i] = k.ok(kc, "PUT", path, {**made[i], "status": st})
            assert made[i]["status"] == st
        cols, rows = _table(kc, f"{base}/fences?fieldSelector=metadata.name=training-{run}")
        assert cols == ["Name", "CAPACITY", "USED", "LENT", "BORROWED", "PENDING", "AGE"]
        assert rows[0][:6] == [f"training-{run}", 16, 9.5, 2, 0, 3]
        cols, rows = _table(kc, f"{base}/queues?fieldSelector=metadata.name=vision-{run}")
        assert cols == ["Name", "FENCE", "NOMINAL", "USED", "BORROWED", "PENDING", "AGE"]
        assert rows[0][:6] == [f"vision-{run}", f"training-{run}", 8, 10, 2, 1]
        # the schema refuses what is not a count, naming the field
        bad = {**made[0], "status": {**f_status, "pending": "three"}}
        path = f"{base}/fences/{made[0]['metadata']['name']}/status"
        status, answer = kc.request("PUT", path, bad)
        assert status == 422 and "status.pending" in answer["message"], answer
        bad_spec = {**fence, "spec": {**fence["spec"], "admits": ["gaming"]}}
        bad_spec["metadata"] = {"name": f"bad-{run}"}
        status, answer = kc.request("POST", f"{base}/fences", bad_spec)
        assert status == 422 and "spec.admits" in answer["message"], answer
    finally:
        for obj, plural in ((fence, "fences"), (queue, "queues")):
            kc.request("DELETE", f"{base}/{plural}/{obj['metadata']['name']}")


# -- the real scheduler under deploy/'s RBAC --------------------------------------------------


def _binding(kind: str, name: str, role_kind: str, role: str, ns: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if ns:
        meta["namespace"] = ns
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [
            {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "User",
                "name": GPUFENCE_SCHEDULER_USER,
            }
        ],
    }


@pytest.fixture(scope="module")
def mig_deployed(k8s_cluster: KubeCluster) -> list[dict[str, Any]]:
    """deploy/mig/ (dynamic MIG's ConfigMap grant), applied where the GPU operator's namespace
    exists, as its header says."""
    if k8s_cluster.request("GET", f"/api/v1/namespaces/{MIG_NS}")[0] == 404:
        k.namespace(k8s_cluster, MIG_NS)
    docs = kapply.documents(DEPLOY / "mig")
    kapply.apply_all(k8s_cluster, docs)
    kapply.apply_all(k8s_cluster, docs)
    assert {d["metadata"]["namespace"] for d in docs} == {MIG_NS}
    return docs


@pytest.fixture
def as_deployed_scheduler(
    k8s_cluster: KubeCluster, deployed: list[dict[str, Any]], mig_deployed: list[dict[str, Any]]
) -> Iterator[str]:
    """The harness user bound to deploy/'s ClusterRole and lease Role and deploy/mig/'s Role
    (and nothing else), for one test: the bindings go again afterwards (other tests expect the
    user to hold no grants). Yields the user's token."""
    kc, run = k8s_cluster, secrets.token_hex(3)
    role = _one(deployed, "ClusterRole")["metadata"]["name"]
    lease_role = _one(deployed, "Role")["metadata"]["name"]
    mig_role = _one(mig_deployed, "Role")["metadata"]["name"]
    cluster_binding = _binding("ClusterRoleBinding", f"test-{run}", "ClusterRole", role, None)
    lease_binding = _binding("RoleBinding", f"test-{run}", "Role", lease_role, NS)
    mig_binding = _binding("RoleBinding", f"test-{run}", "Role", mig_role, MIG_NS)
    k.ok(kc, "POST", f"{RBAC}/clusterrolebindings", cluster_binding, 201)
    k.ok(kc, "POST", f"{RBAC}/namespaces/{NS}/rolebindings", lease_binding, 201)
    k.ok(kc, "POST", f"{RBAC}/namespaces/{MIG_NS}/rolebindings", mig_binding, 201)
    try:
        yield kc.gpufence_scheduler_token
    finally:
        kc.request("DELETE", f"{RBAC}/clusterrolebindings/test-{run}")
        kc.request("DELETE", f"{RBAC}/namespaces/{NS}/rolebindings/test-{run}")
        kc.request("DELETE", f"{RBAC}/namespaces/{MIG_NS}/rolebindings/test-{run}")


def _fenced_config(cm: dict[str, Any], run: str, sched: str) -> str:
    """The ConfigMap's cluster YAML, with this test's scheduler name, and its node selectors
    narrowed to this test's nodes (the API server is shared with other tests' nodes)."""
    spec = yaml.safe_load(cm["data"]["cluster.yaml"])
    spec["kubernetes"]["scheduler_name"] = sched
    for part in spec["partitions"].values():
        part["node_selector"]["test.gpufence.io/run"] = run
    return yaml.safe_dump(spec, sort_keys=False)


def _with_scheduler(docs: list[dict[str, Any]], sched: str) -> list[dict[str, Any]]:
    out = copy.deepcopy(docs)
    for d in out:
        spec = d.get("spec", {})
        spec = spec.get("template", {}).get("spec", spec)
        if "schedulerName" in spec:
            spec["schedulerName"] = sched
    return out


LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/gpufence-scheduler"


def _fenced_nodes(kc: KubeCluster, run: str) -> tuple[str, list[str]]:
    """This test's nodes: a 2-GPU serving node and two 4-GPU training nodes."""
    labels = {"test.gpufence.io/run": run}
    serving = k.gpu_node(
        kc, f"{run}-serving", gpus=2, labels={**labels, "gpufence.io/fence": "serving"}
    )
    training = [
        k.gpu_node(
            kc, f"{run}-training-{i}", gpus=4, labels={**labels, "gpufence.io/fence": "training"}
        )
        for i in range(2)
    ]
    return serving, training


def _readme_examples(sched: str, run: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The README's gang and serving Deployment, as a user applies them, named for this test."""
    gang_docs = _with_scheduler(kapply.documents(EXAMPLES / "gang.yaml"), sched)
    serving_docs = _with_scheduler(kapply.documents(EXAMPLES / "serving.yaml"), sched)
    for d in gang_docs:
        if d["kind"] == "Pod":
            d["metadata"]["name"] = d["metadata"]["name"].replace("resnet", f"resnet-{run}")
            d["metadata"]["annotations"]["gpufence.io/gang-name"] = f"resnet-{run}"
    _one(serving_docs, "Deployment")["metadata"]["name"] = f"llm-{run}"
    return gang_docs, serving_docs


def _pending_with_reason(kc: KubeCluster, ns: str, pod: str) -> None:
    """What kubectl describe pod shows of a waiting pod: the condition and the Event."""
    cond = k.wait("a pending reason", lambda: k.scheduled_condition(k.get_pod(kc, ns, pod)))
    assert cond["reason"] == "Unschedulable" and cond["status"] == "False", cond
    assert not k.node_of(kc, ns, pod)
    k.wait(
        "a FailedScheduling event",
        lambda: [e for e in k.events(kc, ns, pod) if e["reason"] == "FailedScheduling"],
    )


def _fail_one_member(kc: KubeCluster, ns: str, gang: list[str]) -> None:
    """A running gang's first member fails: gpufence deletes the rest (all-or-nothing holds
    for the whole run), which needs its delete and event grants."""
    for p in gang:
        k.set_phase(kc, ns, p, "Running")
    k.set_phase(kc, ns, gang[0], "Failed")
    for p in gang[1:]:
        k.wait(f"{p} deleted", lambda p=p: _deleting(kc, ns, p), 30)


def test_k8s_deploy_rbac_is_enough_for_the_real_scheduler(
    k8s_cluster: KubeCluster,
    deployed: list[dict[str, Any]],
    as_deployed_scheduler: str,
    tmp_path: Path,
) -> None:
    kc, run = k8s_cluster, f"d{secrets.token_hex(3)}"
    sched = f"gpufence-{run}"
    config = tmp_path / "cluster.yaml"
    config.write_text(_fenced_config(_one(deployed, "ConfigMap"), run, sched))
    serving, training = _fenced_nodes(kc, run)
    gang_docs, serving_docs = _readme_examples(sched, run)
    gang = [d["metadata"]["name"] for d in gang_docs if d["kind"] == "Pod"]
    gang_ns = _one(gang_docs, "Namespace")["metadata"]["name"]
    proc = SchedulerProc(
        kc.gpufence_scheduler_kubeconfig,
        config,
        tmp_path / "scheduler.log",
        leader_elect=True,
        identity=f"replica-{run}",
    )
    try:
        proc.wait_ready(timeout=60)
        kapply.apply_all(kc, [*gang_docs, *serving_docs])
        deployment = _one(serving_docs, "Deployment")
        served = play.replica_pods(kc, deployment)  # the harness runs no controllers
        # the gang, bound whole onto the training fence (4 x 2 GPUs fill both nodes)
        nodes = [k.wait(f"{p} bound", lambda p=p: k.node_of(kc, gang_ns, p), 30) for p in gang]
        assert sorted(set(nodes)) == sorted(training)
        # the serving Deployment's pods, inside the serving fence only
        for p in served:
            assert k.wait(f"{p} bound", lambda p=p: k.node_of(kc, "online", p), 30) == serving
        # the Deployment scaled past the serving fence (2 GPUs): the third pod waits
        dep_path = f"/apis/apps/v1/namespaces/online/deployments/llm-{run}"
        k.ok(kc, "PATCH", dep_path + "/scale", {"spec": {"replicas": 3}}, content_type=k.MERGE)
        (waiting,) = play.replica_pods(kc, k.ok(kc, "GET", dep_path))
        _pending_with_reason(kc, "online", waiting)
        _fail_one_member(kc, gang_ns, gang)
        assert k.ok(kc, "GET", LEASE)["spec"]["holderIdentity"] == f"replica-{run}"
        # the state record (budgets, fair share) written under these grants alone
        k.wait("the state record", lambda: kc.request("GET", f"{LEASE}-state")[0] == 200, 20)
        assert proc.proc.poll() is None, proc.log_tail()
    finally:
        proc.stop()
    log = (tmp_path / "scheduler.log").read_text()
    # (a whole-word 403: a random node name such as r27544033 holds the digits too)
    assert not re.search(r"\b403\b", log) and "forbidden" not in log.lower(), log[-3000:]
    # a clean stop hands the lease back
    assert not k.ok(kc, "GET", LEASE)["spec"].get("holderIdentity")


def test_k8s_deploy_mig_rbac_is_enough_for_a_recut_through_the_configmap(
    k8s_cluster: KubeCluster, as_deployed_scheduler: str, tmp_path: Path
) -> None:
    """deploy/mig/'s grant at work: under deploy/'s RBAC alone the scheduler writes a re-cut's
    config into gpu-operator/gpufence-mig-parted, labels the node, and binds -- no 403."""
    kc, run = k8s_cluster, f"m{secrets.token_hex(3)}"
    env = Env(kc, "", run, f"gpufence-{run}", tmp_path / "cluster.yaml", tmp_path, [])
    env.ns = k.namespace(kc, f"ns-{run}")
    env.config.write_text(MIG_FENCE.format(run=run, sched=env.sched))
    cm_path = f"/api/v1/namespaces/{MIG_NS}/configmaps/gpufence-mig-parted"
    kc.request("DELETE", cm_path)
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpufence-mig-parted", "namespace": MIG_NS},
        "data": {"config.yaml": "version: v1\nmig-configs: {}\n"},
    }
    k.ok(kc, "POST", f"/api/v1/namespaces/{MIG_NS}/configmaps", cm, 201)
    node = mig_node(env, "a", gpus=4)
    mgr = FakeMigManager(kc, {}, configmap=f"{MIG_NS}/gpufence-mig-parted", delay_s=0.3)
    mgr.watch(node)
    extra = ["--mig-configmap", f"{MIG_NS}/gpufence-mig-parted", "--mig-config-settle", "0"]
    proc = SchedulerProc(
        kc.gpufence_scheduler_kubeconfig, env.config, tmp_path / "scheduler.log", extra=extra
    )
    try:
        proc.wait_ready(timeout=60)
        big = mig_pod(env, "3g.40gb")
        assert env.bound(big, timeout=40) == node
        held = yaml.safe_load(k.ok(kc, "GET", cm_path)["data"]["config.yaml"])["mig-configs"]
        assert list(held) == [
            k.ok(kc, "GET", f"/api/v1/nodes/{node}")["metadata"]["labels"][k.MIG_CONFIG]
        ]
    finally:
        proc.stop()
        mgr.close()
    log = (tmp_path / "scheduler.log").read_text()
    assert "403" not in log and "forbidden" not in log.lower(), log[-3000:]


def _deleting(kc: KubeCluster, ns: str, pod: str) -> bool:
    status, body = kc.request("GET", f"/api/v1/namespaces/{ns}/pods/{pod}")
    return status == 404 or bool(body["metadata"].get("deletionTimestamp"))


# what src/gpufence/kube/api.py calls: (verb, group, resource, subresource, namespace, name)
USED = [
    ("list", "", "pods", "", "", ""),
    ("watch", "", "pods", "", "", ""),
    ("patch", "", "pods", "", "any-ns", ""),
    ("delete", "", "pods", "", "any-ns", ""),
    ("create", "", "pods", "binding", "any-ns", ""),
    ("create", "", "pods", "eviction", "any-ns", ""),
    ("patch", "", "pods", "status", "any-ns", ""),
    ("create", "", "events", "", "any-ns", ""),
    ("list", "", "nodes", "", "", ""),
    ("watch", "", "nodes", "", "", ""),
    ("patch", "", "nodes", "", "", "any-node"),
    ("list", "scheduling.k8s.io", "podgroups", "", "", ""),
    ("watch", "scheduling.k8s.io", "podgroups", "", "", ""),
    ("create", "coordination.k8s.io", "leases", "", NS, ""),
    ("get", "coordination.k8s.io", "leases", "", NS, "gpufence-scheduler"),
    ("update", "coordination.k8s.io", "leases", "", NS, "gpufence-scheduler"),
    ("get", "coordination.k8s.io", "leases", "", NS, "gpufence-scheduler-state"),
    ("update", "coordination.k8s.io", "leases", "", NS, "gpufence-scheduler-state"),
    ("get", "gpufence.io", "fences", "", "", "training"),
    ("create", "gpufence.io", "queues", "", "", ""),
    ("update", "gpufence.io", "fences", "status", "", "training"),
    ("update", "gpufence.io", "queues", "status", "", "vision"),
    ("list", "resource.k8s.io", "resourceslices", "", "", ""),
    ("watch", "resource.k8s.io", "resourceslices", "", "", ""),
    ("list", "resource.k8s.io", "resourceclaims", "", "", ""),
    ("watch", "resource.k8s.io", "resourceclaims", "", "", ""),
    ("get", "resource.k8s.io", "resourceclaims", "", "any-ns", "any"),
    ("patch", "resource.k8s.io", "resourceclaims", "", "any-ns", "any"),
    ("update", "resource.k8s.io", "resourceclaims", "status", "any-ns", "any"),
    # --mig-configmap: the MIG manager's ConfigMap, read and updated (kube/mig_configmap.py)
    ("get", "", "configmaps", "", MIG_NS, "gpufence-mig-parted"),
    ("update", "", "configmaps", "", MIG_NS, "gpufence-mig-parted"),
]
NOT_NEEDED = [
    ("delete", "", "nodes", "", "", "any-node"),
    ("update", "", "nodes", "", "", "any-node"),
    ("get", "", "secrets", "", NS, "any"),
    ("list", "", "secrets", "", "", ""),
    ("create", "", "pods", "", "any-ns", ""),
    ("update", "", "pods", "", "any-ns", "any"),
    ("get", "", "configmaps", "", NS, "gpufence-cluster"),  # mounted, never read through the API
    ("delete", "", "events", "", "any-ns", "any"),
    ("update", "coordination.k8s.io", "leases", "", NS, "kube-scheduler"),
    ("get", "coordination.k8s.io", "leases", "", "kube-system", "kube-scheduler"),
    ("delete", "coordination.k8s.io", "leases", "", NS, "gpufence-scheduler"),
    ("delete", "gpufence.io", "fences", "", "", "training"),
    ("create", "apiextensions.k8s.io", "customresourcedefinitions", "", "", ""),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", "", "", ""),
    ("create", "scheduling.k8s.io", "podgroups", "", "any-ns", ""),
    ("delete", "resource.k8s.io", "resourceclaims", "", "any-ns", "any"),
    ("create", "resource.k8s.io", "resourceslices", "", "", ""),
    # only the one ConfigMap, only in the operator's namespace: not the operator's own config
    ("update", "", "configmaps", "", MIG_NS, "default-mig-parted-config"),
    ("get", "", "configmaps", "", MIG_NS, "default-mig-parted-config"),
    ("create", "", "configmaps", "", MIG_NS, ""),
    ("list", "", "configmaps", "", MIG_NS, ""),
    ("delete", "", "configmaps", "", MIG_NS, "gpufence-mig-parted"),
    ("patch", "", "configmaps", "", MIG_NS, "gpufence-mig-parted"),
    ("update", "", "configmaps", "", NS, "gpufence-mig-parted"),
]


def _may(kc: KubeCluster, token: str, attrs: tuple[str, ...]) -> bool:
    verb, group, resource, sub, ns, name = attrs
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "verb": verb,
                "group": group,
                "resource": resource,
                "subresource": sub,
                "namespace": ns,
                "name": name,
            }
        },
    }
    path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    body = k.ok(kc, "POST", path, review, 201, token=token)
    return bool(body["status"].get("allowed"))


def test_k8s_deploy_role_is_least_privilege(
    k8s_cluster: KubeCluster, as_deployed_scheduler: str
) -> None:
    kc, token = k8s_cluster, as_deployed_scheduler
    assert [a for a in USED if not _may(kc, token, a)] == []
    assert [a for a in NOT_NEEDED if _may(kc, token, a)] == []
    # and the API server itself answers 403
    node = k.gpu_node(kc, f"victim-{secrets.token_hex(3)}")
    for method, path in (
        ("DELETE", f"/api/v1/nodes/{node}"),
        ("GET", f"/api/v1/namespaces/{NS}/secrets"),
        ("GET", "/api/v1/secrets"),
        ("GET", f"/api/v1/namespaces/{NS}/configmaps/gpufence-cluster"),
    ):
        status, body = kc.request(method, path, token=token)
        assert status == 403, f"{method} {path}: {status} {body}"
    assert k.ok(kc, "GET", f"/api/v1/nodes/{node}")["metadata"]["name"] == node


def test_k8s_deploy_play_makes_what_the_harness_lacks(
    k8s_cluster: KubeCluster, tmp_path: Path
) -> None:
    """The README's harness walk-through: tests/k8s/play.py makes Ready GPU nodes of a fence
    and a Deployment's pods, through a kubeconfig as a user would."""
    kc, run = k8s_cluster, secrets.token_hex(3)
    ns = k.namespace(kc)
    dep = copy.deepcopy(_one(kapply.documents(EXAMPLES / "serving.yaml"), "Deployment"))
    dep["metadata"].update(name=f"llm-{run}", namespace=ns)
    kapply.apply(kc, dep)
    env = {**os.environ, "KUBECONFIG": str(kc.kubeconfig)}
    script = Path(play.__file__)
    for args in (["nodes", f"t-{run}=training:4"], ["replicas", f"{ns}/llm-{run}"]):
        proc = subprocess.run(
            [sys.executable, str(script), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
    node = k.ok(kc, "GET", f"/api/v1/nodes/t-{run}")
    assert node["metadata"]["labels"]["gpufence.io/fence"] == "training"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert not node["spec"].get("taints")
    assert [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"] == ["True"]
    pods = k.pods(kc, ns)
    assert sorted(p["metadata"]["name"] for p in pods) == [f"llm-{run}-0", f"llm-{run}-1"]
    assert {p["spec"]["schedulerName"] for p in pods} == {"gpufence"}
    assert {p["metadata"]["labels"]["gpufence.io/class"] for p in pods} == {"serving"}
    # scaled up: only the new replica is made
    scale = f"/apis/apps/v1/namespaces/{ns}/deployments/llm-{run}/scale"
    k.ok(kc, "PATCH", scale, {"spec": {"replicas": 3}}, content_type=k.MERGE)
    again = subprocess.run(
        [sys.executable, str(script), "replicas", f"{ns}/llm-{run}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 0 and again.stdout.split() == [
        f"pod/llm-{run}-2",
        "created",
        "in",
        ns,
    ]
    bad = subprocess.run(
        [sys.executable, str(script), "nodes", "x=training"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode != 0 and "NAME=FENCE:GPUS" in bad.stderr
