"""Fence and Queue custom resources: ``kubectl get fences`` answers "who holds what".

The fence file stays the one source of policy (the ConfigMap the scheduler reads); the leader
mirrors each partition into a cluster-scoped ``Fence`` and each queue into a ``Queue``
(group ``gpufence.io``, v1alpha1, CRDs in deploy/01-crds.yaml), with the policy in ``spec`` and
the live figures in ``status``. Why custom resources and not only ``/metrics``: a platform team
already reads its cluster through ``kubectl``; the objects are RBAC-scoped, watchable and show up
in ``kubectl get`` with printer columns. Editing a Fence does not change policy (the ConfigMap
does); its ``spec`` is rewritten from the file on the next publish, and the docs say so.

Writes happen only when a figure changed, from a thread of its own: a slow API server delays
the status, never a bind.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpufence.kube.api import CallFailed, KubeApi
from gpufence.kube.fences import FenceSpec

log = logging.getLogger("gpufence.kube")

GROUP_PATH = "/apis/gpufence.io/v1alpha1"


def fence_object(fences: FenceSpec, row: Mapping[str, Any]) -> dict[str, Any]:
    name = row["name"]
    part = fences.policy.partitions[name]
    return {
        "apiVersion": "gpufence.io/v1alpha1",
        "kind": "Fence",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpufence"}},
        "spec": {
            "nodeSelector": dict(fences.selectors.get(name, {})),
            "admits": sorted(str(c) for c in part.admits),
            "sharing": str(part.sharing),
        },
        "status": {
            "nodes": row["nodes"],
            "capacityGPUs": row["capacity_gpus"],
            "usedGPUs": row["used_gpus"],
            "lentGPUs": row["lent_gpus"],
            "borrowedGPUs": row["borrowed_gpus"],
            "running": row["running"],
            "pending": row["pending"],
            "largestGang": row["largest_gang"],
        },
    }


def queue_object(row: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"partition": row["partition"], "tenant": row["tenant"]}
    if row["nominal_gpus"] is not None:
        spec["nominalGPUs"] = row["nominal_gpus"]
    return {
        "apiVersion": "gpufence.io/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": row["name"], "labels": {"app.kubernetes.io/managed-by": "gpufence"}},
        "spec": spec,
        "status": {
            "usedGPUs": row["used_gpus"],
            "borrowedGPUs": row["borrowed_gpus"],
            "running": row["running"],
            "pending": row["pending"],
        },
    }


class StatusPublisher:
    def __init__(self, api: KubeApi, fences: FenceSpec) -> None:
        self.api, self.fences = api, fences
        self._sent: dict[str, dict[str, Any]] = {}  # path -> the object last written there
        self.available = True  # False once the API server says the CRDs are not installed
        self.writes = 0

    def publish(self, fence_rows: list[dict[str, Any]], queue_rows: list[dict[str, Any]]) -> None:
        if not self.available:
            return
        objects = [("fences", fence_object(self.fences, r)) for r in fence_rows]
        objects += [("queues", queue_object(r)) for r in queue_rows]
        for plural, obj in objects:
            path = f"{GROUP_PATH}/{plural}/{obj['metadata']['name']}"
            if self._sent.get(path) == obj:
                continue
            try:
                self._put(path, plural, obj)
                self._sent[path] = obj
            except CallFailed as exc:
                if exc.code == 404:  # the collection itself is unknown: no CRD
                    log.warning(
                        "Fence/Queue CRDs are not installed (deploy/01-crds.yaml): no status"
                    )
                    self.available = False
                    return
                log.warning("status of %s: %s", path, exc)

    def _put(self, path: str, plural: str, obj: dict[str, Any]) -> None:
        current = self.api.get_raw(path)
        if current is None:
            self.api.write_raw("POST", f"{GROUP_PATH}/{plural}", {**obj, "status": None})
            current = self.api.get_raw(path)
            if current is None:
                raise CallFailed(404, f"{path} vanished after its create")
        meta = current.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if current.get("spec") != obj["spec"]:
            body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": version}}
            self.api.write_raw("PUT", path, {**body, "status": current.get("status")})
            current = self.api.get_raw(path) or current
            meta = current.get("metadata")
            version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        status_body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": version}}
        self.api.write_raw("PUT", f"{path}/status", status_body)
        self.writes += 1
