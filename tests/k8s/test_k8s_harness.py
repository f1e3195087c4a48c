"""Smoke tests of the Kubernetes test harness: a real kube-apiserver (built from k8s.io/kubernetes
by harness/build.sh) on 127.0.0.1 accepts the objects a GPU scheduler front end works with:
Nodes with ``nvidia.com/gpu`` allocatable, Pods for ``schedulerName: gpufence`` that nobody else
binds, and bindings through ``pods/binding``."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from cluster import LOOPBACK, KubeCluster

GPU = "nvidia.com/gpu"
K8S_VERSION = "v1.37.2"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _ok(
    kc: KubeCluster, method: str, path: str, obj: Any = None, *, expect: int = 200, **kw: Any
) -> Any:
    status, body = kc.request(method, path, obj, **kw)
    assert status == expect, f"{method} {path}: {status} {body}"
    return body


def _namespace(kc: KubeCluster) -> str:
    ns = _name("k8s-test")
    _ok(
        kc,
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        expect=201,
    )
    return ns


def _gpu_node(kc: KubeCluster, gpus: int = 8) -> str:
    """A Node object (no kubelet behind it) whose status, set through the status subresource,
    offers ``gpus`` GPUs."""
    node = _name("gpu-node")
    _ok(
        kc,
        "POST",
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node, "labels": {"gpufence.io/test": "1"}},
        },
        expect=201,
    )
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: str(gpus)}
    ready = {"type": "Ready", "status": "True", "reason": "HarnessKubelet"}
    patched = _ok(
        kc,
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}},
        content_type="application/merge-patch+json",
    )
    # the TaintNodesByCondition admission plugin taints a new node not-ready; a kubelet's
    # node lifecycle controller would lift it once Ready, the harness plays that part here
    _ok(
        kc,
        "PATCH",
        f"/api/v1/nodes/{node}",
        {"spec": {"taints": None}},
        content_type="application/merge-patch+json",
    )
    assert patched["status"]["allocatable"][GPU] == str(gpus)
    return node


def _pod(kc: KubeCluster, ns: str, *, scheduler: str | None = "gpufence", gpus: int = 1) -> str:
    pod = _name("pod")
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "busybox", "resources": {"limits": {GPU: str(gpus)}}}
        ],
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    created = _ok(
        kc,
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod}, "spec": spec},
        expect=201,
    )
    assert created["status"]["phase"] == "Pending"
    return pod


def _get_pod(kc: KubeCluster, ns: str, pod: str) -> dict[str, Any]:
    return dict(_ok(kc, "GET", f"/api/v1/namespaces/{ns}/pods/{pod}"))


def _bind(
    kc: KubeCluster, ns: str, pod: str, node: str, *, token: str | None = None, expect: int = 201
) -> None:
    _ok(
        kc,
        "POST",
        f"/api/v1/namespaces/{ns}/pods/{pod}/binding",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
        token=token,
        expect=expect,
    )


def test_k8s_apiserver_ready(k8s_cluster: KubeCluster) -> None:
    status, body = k8s_cluster.request_raw("GET", "/readyz")
    assert (status, body) == (200, b"ok")
    version = _ok(k8s_cluster, "GET", "/version")
    assert version["gitVersion"] == K8S_VERSION, version  # build.sh stamps the release version
    assert k8s_cluster.server == f"https://{LOOPBACK}:{k8s_cluster.port}"
    assert Path(k8s_cluster.kubeconfig).is_file()


def test_k8s_rejects_unknown_token(k8s_cluster: KubeCluster) -> None:
    status, _ = k8s_cluster.request("GET", "/api/v1/namespaces", token="not-a-token")
    assert status == 401


def _listening(pid: int) -> list[str]:
    """host:port of every TCP socket process ``pid`` listens on (Linux /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, v6 in ((f"/proc/{pid}/net/tcp", False), (f"/proc/{pid}/net/tcp6", True)):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                continue
            addr, port = cols[1].split(":")
            raw = bytes.fromhex(addr)
            if v6 and raw[:12] != bytes(8) + b"\xff\xff\x00\x00":  # 32-bit words, host order
                host = f"[{raw.hex()}]"  # a real IPv6 address: never expected
            else:  # IPv4, or IPv4-mapped IPv6 (little-endian words in /proc)
                host = ".".join(str(b) for b in reversed(raw[-4:]))
            found.append(f"{host}:{int(port, 16)}")
    return found


@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="needs Linux /proc")
def test_k8s_components_listen_on_loopback_only(k8s_cluster: KubeCluster) -> None:
    procs = list(k8s_cluster._procs)  # etcd, kube-apiserver
    assert [p.name for p in procs] == ["etcd", "kube-apiserver"]
    for proc in procs:
        addrs = _listening(proc.popen.pid)
        assert addrs, f"{proc.name} listens on nothing?"
        assert all(a.startswith(f"{LOOPBACK}:") for a in addrs), f"{proc.name} listens on {addrs}"


def test_k8s_node_gpus_and_gpufence_pod_stays_pending(k8s_cluster: KubeCluster) -> None:
    kc = k8s_cluster
    ns = _namespace(kc)
    node = _gpu_node(kc, gpus=8)
    assert _ok(kc, "GET", f"/api/v1/nodes/{node}")["status"]["allocatable"][GPU] == "8"
    pod = _pod(kc, ns, scheduler="gpufence")
    time.sleep(1)
    got = _get_pod(kc, ns, pod)
    assert got["spec"]["schedulerName"] == "gpufence"
    assert got["status"]["phase"] == "Pending"
    assert not got["spec"].get("nodeName")


def test_k8s_binding_subresource_sets_node_name(k8s_cluster: KubeCluster) -> None:
    kc = k8s_cluster
    ns = _namespace(kc)
    node = _gpu_node(kc)
    pod = _pod(kc, ns, scheduler="gpufence")
    _bind(kc, ns, pod, node)
    assert _get_pod(kc, ns, pod)["spec"]["nodeName"] == node
    # a pod binds once
    _bind(kc, ns, pod, node, expect=409)


def test_k8s_gpufence_scheduler_token_is_subject_to_rbac(k8s_cluster: KubeCluster) -> None:
    """The gpufence-scheduler user authenticates but may do nothing until RBAC grants it."""
    kc = k8s_cluster
    tok = kc.gpufence_scheduler_token
    ns = _namespace(kc)
    node = _gpu_node(kc)
    pod = _pod(kc, ns)
    status, _ = kc.request("GET", "/api/v1/pods", token=tok)
    assert status == 403
    role = _name("gpufence-scheduler")
    _ok(
        kc,
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods", "nodes"],
                    "verbs": ["get", "list", "watch"],
                },
                {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
            ],
        },
        expect=201,
    )
    _ok(
        kc,
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [
                {
                    "kind": "User",
                    "apiGroup": "rbac.authorization.k8s.io",
                    "name": "gpufence-scheduler",
                }
            ],
        },
        expect=201,
    )
    # RBAC picks the new binding up from its informer: give it a moment
    deadline = time.monotonic() + 10
    while kc.request("GET", "/api/v1/pods", token=tok)[0] != 200:
        assert time.monotonic() < deadline, "RBAC grant not effective within 10s"
        time.sleep(0.2)
    _bind(kc, ns, pod, node, token=tok)
    assert _get_pod(kc, ns, pod)["spec"]["nodeName"] == node


@pytest.mark.slow
def test_k8s_kube_scheduler_binds_default_pods_not_gpufence_pods(k8s_cluster: KubeCluster) -> None:
    """The upstream kube-scheduler runs against the harness: it binds a default-scheduler pod
    that asks for a GPU, and leaves the ``schedulerName: gpufence`` pod alone."""
    kc = k8s_cluster
    ns = _namespace(kc)
    node = _gpu_node(kc, gpus=8)
    sched = kc.start_scheduler()
    try:
        theirs = _pod(kc, ns, scheduler=None)
        ours = _pod(kc, ns, scheduler="gpufence")
        deadline = time.monotonic() + 60
        while not _get_pod(kc, ns, theirs)["spec"].get("nodeName"):
            assert sched.poll() is None, "kube-scheduler exited"
            assert time.monotonic() < deadline, (
                "kube-scheduler did not bind the default pod within 60s"
            )
            time.sleep(0.25)
        # any node with free GPUs will do (earlier tests leave GPU nodes behind)
        bound = _ok(kc, "GET", f"/api/v1/nodes/{_get_pod(kc, ns, theirs)['spec']['nodeName']}")
        assert int(bound["status"]["allocatable"][GPU]) >= 1
        time.sleep(2)
        assert not _get_pod(kc, ns, ours)["spec"].get("nodeName")
        assert node  # the node this test added guarantees a fit
    finally:
        sched.terminate()
        sched.wait(timeout=15)
