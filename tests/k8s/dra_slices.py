"""DRA objects for the Kubernetes tests, as the NVIDIA DRA driver and a user would write them
(``resource.k8s.io/v1``): the driver's DeviceClass, a node's ResourceSlice (one device per GPU,
with its index, uuid, product and type), ResourceClaims and ResourceClaimTemplates for whole
GPUs, and a pod that uses them. Plain JSON through the real API server."""

from __future__ import annotations

import random
from typing import Any

import kobjects as k
from cluster import KubeCluster

DRIVER = "gpu.nvidia.com"
CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
# (GI profile id, memory slices) of the H100-80GB profiles the tests cut
MIG_PROFILES = {"1g.10gb": (19, 1), "3g.40gb": (9, 4)}
V1 = "/apis/resource.k8s.io/v1"


def device_class(kc: KubeCluster) -> None:
    """The driver's DeviceClasses, whole GPUs and MIG devices (created once per API server)."""
    for name, kind in ((CLASS, "gpu"), (MIG_CLASS, "mig")):
        status, _ = kc.request("GET", f"{V1}/deviceclasses/{name}")
        if status == 200:
            continue
        expr = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expr}}]},
        }
        status, answer = kc.request("POST", f"{V1}/deviceclasses", body)
        assert status in (201, 409), answer


def mig_slice(kc: KubeCluster, node: str, layout: list[tuple[int, str, int]]) -> None:
    """A node whose GPUs are cut into MIG instances (GPU index, profile, start): the driver's
    later form -- canonical names ``gpu-<minor>-mig-<GI id>-<start>-<size>``, the profile and
    one ``memorySlice<i>`` capacity per memory slice; no whole GPU devices."""
    devices = []
    for gpu, profile, start in layout:
        gi, size = MIG_PROFILES[profile]
        capacity = {f"memorySlice{i}": {"value": "1"} for i in range(start, start + size)}
        devices.append(
            {
                "name": f"gpu-{gpu}-mig-{gi}-{start}-{size}",
                "attributes": {
                    "type": {"string": "mig"},
                    "profile": {"string": profile},
                    "uuid": {"string": f"MIG-{node[-6:]}-{gpu}-{start}"},
                },
                "capacity": capacity,
            }
        )
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
    k.ok(kc, "POST", f"{V1}/resourceslices", body, 201)


def mig_claim(kc: KubeCluster, ns: str, name: str, profile: str) -> str:
    expr = f"device.attributes['{DRIVER}'].profile == '{profile}'"
    exactly = {
        "deviceClassName": MIG_CLASS,
        "allocationMode": "ExactCount",
        "count": 1,
        "selectors": [{"cel": {"expression": expr}}],
    }
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": exactly}]}},
    }
    k.ok(kc, "POST", f"{V1}/namespaces/{ns}/resourceclaims", body, 201)
    return name


def gpu_slice(
    kc: KubeCluster, node: str, gpus: int, *, product: str = "NVIDIA H100 80GB HBM3", seed: int = 0
) -> dict[str, Any]:
    """The node's ResourceSlice: one device ``gpu-<index>`` per GPU, listed in a shuffled order
    (what names a GPU is its ``index`` attribute, not its place in the list)."""
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "index": {"int": i},
                "minor": {"int": i},
                "uuid": {"string": f"GPU-{node[-6:]}-{i:04d}"},
                "productName": {"string": product},
                "type": {"string": "gpu"},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for i in range(gpus)
    ]
    random.Random(seed).shuffle(devices)
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
    return dict(k.ok(kc, "POST", f"{V1}/resourceslices", body, 201))


def _requests(gpus: int, device_class: str) -> dict[str, Any]:
    exactly = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": gpus}
    return {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}


def claim(kc: KubeCluster, ns: str, name: str, gpus: int, device_class: str = CLASS) -> str:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": _requests(gpus, device_class),
    }
    k.ok(kc, "POST", f"{V1}/namespaces/{ns}/resourceclaims", body, 201)
    return name


def claim_template(kc: KubeCluster, ns: str, name: str, gpus: int) -> str:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": _requests(gpus, CLASS)},
    }
    k.ok(kc, "POST", f"{V1}/namespaces/{ns}/resourceclaimtemplates", body, 201)
    return name


def get_claim(kc: KubeCluster, ns: str, name: str) -> dict[str, Any]:
    return dict(k.ok(kc, "GET", f"{V1}/namespaces/{ns}/resourceclaims/{name}"))


def claims_spec(*, claim_name: str = "", template: str = "") -> dict[str, object]:
    """A pod spec's ``resourceClaims`` (one, named ``gpus``), to pass as ``kobjects.pod(spec=)``
    together with ``resources={}`` and ``container_claims``."""
    ref = {"resourceClaimName": claim_name} if claim_name else {}
    if template:
        ref = {"resourceClaimTemplateName": template}
    return {"resourceClaims": [{"name": "gpus", **ref}]}


def dra_pod(
    kc: KubeCluster,
    ns: str,
    name: str,
    scheduler: str,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **ref: str,
) -> str:
    """A pod whose one container uses the claim (no nvidia.com/gpu)."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpus"}]}}
            ],
            **claims_spec(**ref),
        },
    }
    k.ok(kc, "POST", f"/api/v1/namespaces/{ns}/pods", body, 201)
    return name


def allocated(claim_obj: dict[str, Any]) -> list[str]:
    """The devices a claim is allocated to, as ``pool/device``."""
    allocation = (claim_obj.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return sorted(f"{r['pool']}/{r['device']}" for r in results)


def allocated_node(claim_obj: dict[str, Any]) -> str:
    allocation = (claim_obj.get("status") or {}).get("allocation") or {}
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or [{}]
    fields = terms[0].get("matchFields") or [{}]
    return str((fields[0].get("values") or [""])[0])


def reserved_for(claim_obj: dict[str, Any]) -> list[str]:
    return [r["name"] for r in (claim_obj.get("status") or {}).get("reservedFor") or []]


def allocate_as_another_scheduler(
    kc: KubeCluster, ns: str, claim_name: str, node: str, devices: list[int], pod: dict[str, Any]
) -> None:
    """Write a claim's allocation as kube-scheduler would for a pod it placed."""
    results = [
        {"request": "gpus", "driver": DRIVER, "pool": node, "device": f"gpu-{i}"} for i in devices
    ]
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    status = {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [term]},
        },
        "reservedFor": [
            {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        ],
    }
    path = f"{V1}/namespaces/{ns}/resourceclaims/{claim_name}/status"
    k.ok(kc, "PATCH", path, {"status": status}, content_type=k.MERGE)
