"""A small ``kubectl apply`` for the tests (there is no kubectl here): each YAML document is
POSTed to its collection, and PUT over the existing object (with its resourceVersion) when it
exists already. Paths come from the API server's discovery, so custom resources work once their
CRD is established. Not a three-way merge: what a document leaves out is dropped on a PUT, which
is what the tests want (the deploy/ files are the whole truth)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import kobjects as k
import yaml
from cluster import KubeCluster


def documents(*paths: str | Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document of the files (a directory: its *.yaml files, sorted by name,
    as ``kubectl apply -f DIR`` reads them)."""
    out: list[dict[str, Any]] = []
    for p in map(Path, paths):
        files = sorted(p.glob("*.yaml")) + sorted(p.glob("*.yml")) if p.is_dir() else [p]
        for f in files:
            out.extend(d for d in yaml.safe_load_all(f.read_text()) if d)
    return out


def _discovery_path(api_version: str) -> str:
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


def resource_of(kc: KubeCluster, api_version: str, kind: str) -> tuple[str, bool]:
    """(plural, namespaced) of a kind, from discovery (asked each time: a CRD may be new)."""
    status, body = kc.request("GET", _discovery_path(api_version))
    if status != 200:
        raise LookupError(f"{api_version}: discovery answered {status} {body}")
    for r in body["resources"]:
        if r["kind"] == kind and "/" not in r["name"]:
            return str(r["name"]), bool(r["namespaced"])
    raise LookupError(f"{api_version} serves no kind {kind}")


def object_path(kc: KubeCluster, obj: dict[str, Any], *, named: bool = True) -> str:
    """The object's URL path (``named=False``: its collection's)."""
    plural, namespaced = resource_of(kc, obj["apiVersion"], obj["kind"])
    meta = obj["metadata"]
    base = _discovery_path(obj["apiVersion"])
    if namespaced:
        base += f"/namespaces/{meta.get('namespace') or 'default'}"
    base += f"/{plural}"
    return f"{base}/{meta['name']}" if named else base


def apply(kc: KubeCluster, obj: dict[str, Any], *, token: str | None = None) -> dict[str, Any]:
    """Create the object, or replace it if it exists; returns what the API server stored."""
    status, body = kc.request("POST", object_path(kc, obj, named=False), obj, token=token)
    if status == 409:
        path = object_path(kc, obj)
        status, current = kc.request("GET", path, token=token)
        assert status == 200, f"GET {path}: {status} {current}"
        new = {**obj, "metadata": {**obj["metadata"]}}
        new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        status, body = kc.request("PUT", path, new, token=token)
        assert status == 200, f"PUT {path}: {status} {body}"
        return dict(body)
    assert status == 201, f"POST {obj['kind']} {obj['metadata']['name']}: {status} {body}"
    return dict(body)


def apply_all(kc: KubeCluster, objs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Apply in order; a CRD is waited for until established, so that later documents (and
    callers) may use its kind at once."""
    out = []
    for obj in objs:
        out.append(apply(kc, obj))
        if obj["kind"] == "CustomResourceDefinition":
            wait_established(kc, obj["metadata"]["name"])
    return out


def wait_established(kc: KubeCluster, crd: str, timeout: float = 30.0) -> None:
    """Until the CRD is Established and its kind is in discovery (which lags a little)."""
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"

    def served() -> bool:
        _, body = kc.request("GET", path)
        conds = (body or {}).get("status", {}).get("conditions") or []
        if not any(c["type"] == "Established" and c["status"] == "True" for c in conds):
            return False
        spec = body["spec"]
        version = next(v["name"] for v in spec["versions"] if v.get("served"))
        try:
            resource_of(kc, f"{spec['group']}/{version}", spec["names"]["kind"])
        except LookupError:
            return False
        return True

    k.wait(f"CRD {crd} established and served", served, timeout)
