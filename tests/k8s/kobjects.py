"""Objects the Kubernetes tests create through the real API server: namespaces, fake GPU nodes
(status set as a kubelet would), pods for gpufence, and waiting for what the scheduler does."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from cluster import KubeCluster

GPU = "nvidia.com/gpu"
MERGE = "application/merge-patch+json"


def name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def ok(
    kc: KubeCluster, method: str, path: str, obj: Any = None, expect: int = 200, **kw: Any
) -> Any:
    status, body = kc.request(method, path, obj, **kw)
    assert status == expect, f"{method} {path}: {status} {body}"
    return body


def namespace(kc: KubeCluster, ns: str | None = None) -> str:
    ns = ns or name("ns")
    ok(
        kc,
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        201,
    )
    return ns


def gpu_node(
    kc: KubeCluster,
    node: str | None = None,
    *,
    gpus: int = 8,
    labels: dict[str, str] | None = None,
    product: str = "NVIDIA-H100-80GB-HBM3",
    cpu: str = "64",
    memory: str = "512Gi",
    ready: bool = True,
) -> str:
    node = node or name("gpu-node")
    meta_labels = {
        "kubernetes.io/hostname": node,
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(gpus),
        **(labels or {}),
    }
    ok(
        kc,
        "POST",
        "/api/v1/nodes",
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": meta_labels}},
        201,
    )
    set_node(kc, node, gpus=gpus, cpu=cpu, memory=memory, ready=ready)
    # a kubelet's node lifecycle would lift the not-ready taint the admission plugin adds
    ok(kc, "PATCH", f"/api/v1/nodes/{node}", {"spec": {"taints": None}}, content_type=MERGE)
    return node


def set_node(
    kc: KubeCluster,
    node: str,
    *,
    gpus: int = 8,
    cpu: str = "64",
    memory: str = "512Gi",
    ready: bool = True,
) -> None:
    resources = {"cpu": cpu, "memory": memory, "pods": "110", GPU: str(gpus)}
    cond = {"type": "Ready", "status": "True" if ready else "False", "reason": "TestKubelet"}
    ok(
        kc,
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        {"status": {"capacity": resources, "allocatable": resources, "conditions": [cond]}},
        content_type=MERGE,
    )


def pod(
    kc: KubeCluster,
    ns: str,
    pod_name: str | None = None,
    *,
    gpus: int = 1,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    scheduler: str = "gpufence",
    resources: dict[str, str] | None = None,
    group: str = "",
    grace_s: int | None = None,
    owner: dict[str, Any] | None = None,
    spec: dict[str, object] | None = None,
) -> str:
    """A pending pod; ``spec`` adds fields to its spec (nodeSelector, affinity, ...)."""
    pod_name = pod_name or name("pod")
    limits = resources if resources is not None else {GPU: str(gpus)}
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
            **(spec or {}),
        },
    }
    if group:
        body["spec"]["schedulingGroup"] = {"podGroupName": group}  # type: ignore[index]
    if grace_s is not None:  # how long a deleted pod's containers get (the fake kubelet waits it)
        body["spec"]["terminationGracePeriodSeconds"] = grace_s  # type: ignore[index]
    if owner is not None:  # an ownerReference, as a controller sets it
        body["metadata"]["ownerReferences"] = [owner]  # type: ignore[index]
    ok(kc, "POST", f"/api/v1/namespaces/{ns}/pods", body, 201)
    return pod_name


def pod_group(kc: KubeCluster, ns: str, group: str, min_count: int | None) -> None:
    policy = {"gang": {"minCount": min_count}} if min_count is not None else {"basic": {}}
    body = {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": group},
        "spec": {"schedulingPolicy": policy},
    }
    ok(kc, "POST", f"/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups", body, 201)


def gang(
    kc: KubeCluster,
    ns: str,
    gang_name: str,
    size: int,
    *,
    gpus: int = 1,
    labels: dict[str, str] | None = None,
) -> list[str]:
    ann = {"gpufence.io/gang-name": gang_name, "gpufence.io/gang-size": str(size)}
    return [
        pod(kc, ns, f"{gang_name}-{i}", gpus=gpus, labels=labels, annotations=ann)
        for i in range(size)
    ]


def get_pod(kc: KubeCluster, ns: str, pod_name: str) -> dict[str, Any]:
    return dict(ok(kc, "GET", f"/api/v1/namespaces/{ns}/pods/{pod_name}"))


def pods(kc: KubeCluster, ns: str) -> list[dict[str, Any]]:
    return list(ok(kc, "GET", f"/api/v1/namespaces/{ns}/pods")["items"])


def set_phase(kc: KubeCluster, ns: str, pod_name: str, phase: str) -> None:
    ok(
        kc,
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{pod_name}/status",
        {"status": {"phase": phase}},
        content_type=MERGE,
    )


def delete_pod(kc: KubeCluster, ns: str, pod_name: str, grace: int = 0) -> None:
    status, body = kc.request(
        "DELETE", f"/api/v1/namespaces/{ns}/pods/{pod_name}?gracePeriodSeconds={grace}"
    )
    assert status in (200, 202, 404), f"delete {ns}/{pod_name}: {status} {body}"


def events(kc: KubeCluster, ns: str, pod_name: str) -> list[dict[str, Any]]:
    sel = f"involvedObject.name={pod_name}"
    return list(ok(kc, "GET", f"/api/v1/namespaces/{ns}/events?fieldSelector={sel}")["items"])


def wait(what: str, probe: Callable[[], Any], timeout: float = 30.0, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(
        f"timed out after {timeout:g}s waiting for {what} (last: "
        f"{json.dumps(last, default=str)[:500]})"
    )


def node_of(kc: KubeCluster, ns: str, pod_name: str) -> str:
    return str(get_pod(kc, ns, pod_name)["spec"].get("nodeName") or "")


def scheduled_condition(p: dict[str, Any]) -> dict[str, Any] | None:
    for cond in p.get("status", {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled":
            return dict(cond)
    return None


def get_pod_or_none(kc: KubeCluster, ns: str, pod_name: str) -> dict[str, Any] | None:
    status, body = kc.request("GET", f"/api/v1/namespaces/{ns}/pods/{pod_name}")
    if status == 404:
        return None
    assert status == 200, body
    return dict(body)


MIG_CONFIG = "nvidia.com/mig.config"  # the GPU operator MIG manager's labels
MIG_STATE = "nvidia.com/mig.config.state"
