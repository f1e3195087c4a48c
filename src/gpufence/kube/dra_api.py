"""The DRA calls (``resource.k8s.io/v1``): list and watch ResourceSlices and ResourceClaims,
write a claim's allocation before its pod is bound, release it when the pod ends.

A claim is written as kube-scheduler writes one it allocates: the finalizer
``resource.kubernetes.io/delete-protection`` first (a claim in use is not deleted under its
pod), then ``status.allocation`` (the devices, and a node selector for the node) with the pod in
``status.reservedFor``, by update with the claim's resourceVersion (a conflicting writer -- the
claim controller -- makes it read again and retry, never overwrite).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from gpufence.kube.api import CallFailed, KubeApi
from gpufence.kube.dra_objects import FINALIZER, ClaimRelease, ClaimWrite

log = logging.getLogger("gpufence.kube")

BASE = "/apis/resource.k8s.io/v1"
_MERGE = "application/merge-patch+json"
_TRIES = 5


def serves_dra(api: KubeApi) -> bool:
    """Whether the API server serves DRA v1 and this scheduler may read its objects."""
    try:
        found = api.get_raw(BASE)
    except CallFailed:
        return False
    resources = found.get("resources") if found else None
    names = (
        {r.get("name") for r in resources if isinstance(r, dict)}
        if isinstance(resources, list)
        else set()
    )
    if not {"resourceclaims", "resourceslices"} <= names:
        return False
    try:
        api.get_raw(f"{BASE}/resourceslices?limit=1")
        api.get_raw(f"{BASE}/resourceclaims?limit=1")
    except CallFailed as exc:
        if exc.code != 403:
            raise
        log.error(
            "resource.k8s.io/v1 is served but this scheduler may not read ResourceSlices and "
            "ResourceClaims (deploy/02-rbac.yaml grants it): pods with claims are not scheduled"
        )
        return False
    return True


def list_claims(api: KubeApi) -> tuple[list[Any], str]:
    it = api.client.list(ResourceClaim, namespace="*", chunk_size=2000)
    items = list(it)
    return items, it.resourceVersion


def watch_claims(api: KubeApi, version: str) -> Iterator[tuple[str, Any]]:
    return api.client.watch(ResourceClaim, namespace="*", resource_version=version)


def list_slices(api: KubeApi) -> tuple[list[Any], str]:
    it = api.client.list(ResourceSlice, chunk_size=2000)
    items = list(it)
    return items, it.resourceVersion


def watch_slices(api: KubeApi, version: str) -> Iterator[tuple[str, Any]]:
    return api.client.watch(ResourceSlice, resource_version=version)


def _path(namespace: str, claim: str) -> str:
    return f"{BASE}/namespaces/{namespace}/resourceclaims/{claim}"


def _get(api: KubeApi, namespace: str, claim: str, uid: str = "") -> dict[str, Any] | None:
    obj = api.get_raw(_path(namespace, claim))
    if obj is not None and uid and _meta(obj).get("uid") != uid:
        raise CallFailed(409, f"ResourceClaim {namespace}/{claim} was replaced meanwhile")
    return obj


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.setdefault("metadata", {})
    assert isinstance(meta, dict)
    return meta


def _set_finalizer(api: KubeApi, obj: dict[str, Any], path: str, on: bool) -> dict[str, Any]:
    meta = _meta(obj)
    have = list(meta.get("finalizers") or [])
    want = [*have, FINALIZER] if on else [f for f in have if f != FINALIZER]
    if (FINALIZER in have) == on:
        return obj
    patch = {"metadata": {"finalizers": want, "resourceVersion": meta.get("resourceVersion")}}
    return api.write_json("PATCH", path, patch, _MERGE)


def allocate(api: KubeApi, w: ClaimWrite) -> None:
    """Write the claim's allocation for the pod (before its bind). Raises CallFailed when the
    claim is gone, replaced, or allocated to other devices."""
    path = _path(w.namespace, w.claim)
    for attempt in range(_TRIES):
        obj = _get(api, w.namespace, w.claim, w.claim_uid)
        if obj is None:
            raise CallFailed(404, f"ResourceClaim {w.namespace}/{w.claim} is gone")
        try:
            if w.devices:
                obj = _set_finalizer(api, obj, path, True)
            status = obj.setdefault("status", {})
            allocation = status.get("allocation")
            if allocation is None and w.devices:
                status["allocation"] = _allocation(w)
            elif w.devices and _devices(allocation) != _devices(_allocation(w)):
                raise CallFailed(
                    409,
                    f"ResourceClaim {w.namespace}/{w.claim} is allocated to other devices "
                    f"({', '.join(sorted(_devices(allocation)))})",
                )
            reserved = list(status.get("reservedFor") or [])
            if any(r.get("uid") == w.pod_uid for r in reserved) and allocation is not None:
                return
            reserved.append({"resource": "pods", "name": w.pod, "uid": w.pod_uid})
            status["reservedFor"] = reserved
            api.write_json("PUT", f"{path}/status", obj)
            return
        except CallFailed as exc:
            if exc.code != 409 or "allocated to other" in exc.message or attempt == _TRIES - 1:
                raise


def _allocation(w: ClaimWrite) -> dict[str, Any]:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [w.node]}]}
    results = [
        {"request": d.request, "driver": d.driver, "pool": d.pool, "device": d.device}
        for d in w.devices
    ]
    return {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [term]}}


def _devices(allocation: Any) -> set[str]:
    results = ((allocation or {}).get("devices") or {}).get("results") or []
    return {f"{r.get('pool')}/{r.get('device')}" for r in results}


def release(api: KubeApi, r: ClaimRelease) -> None:
    """Take the pod out of the claim's ``reservedFor``; with no one left, clear the allocation
    (its devices are free again) and the finalizer. A claim already gone is released."""
    path = _path(r.namespace, r.claim)
    for attempt in range(_TRIES):
        obj = _get(api, r.namespace, r.claim)
        if obj is None:
            return
        try:
            status = obj.setdefault("status", {})
            reserved = [x for x in status.get("reservedFor") or [] if x.get("uid") != r.pod_uid]
            if reserved != list(status.get("reservedFor") or []) or (
                not reserved and "allocation" in status
            ):
                status["reservedFor"] = reserved or None
                if not reserved:
                    status.pop("allocation", None)
                obj = api.write_json("PUT", f"{path}/status", obj)
            if not reserved:
                _set_finalizer(api, obj, path, False)
            return
        except CallFailed as exc:
            if exc.code == 404:
                return
            if exc.code != 409 or attempt == _TRIES - 1:
                raise
