"""The few API calls gpufence makes, over lightkube (see docs/kubernetes.md for why lightkube).

Every verb here is one the ClusterRole in deploy/ grants; nothing else is called. Errors are
lightkube's ``ApiError`` (an HTTP status from the API server) or httpx's transport errors; the
callers decide what each means.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import secrets
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
from lightkube import ApiError, Client, KubeConfig
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.scheduling_v1beta1 import PodGroup

from gpufence.kube import names

__all__ = ["ApiError", "CallFailed", "KubeApi"]

log = logging.getLogger("gpufence.kube")

_HOST = os.uname().nodename


class CallFailed(Exception):
    """A write the API server refused: its HTTP status and message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class KubeApi:
    def __init__(self, kubeconfig: str | None = None, *, timeout_s: float = 30.0) -> None:
        if kubeconfig:
            config = KubeConfig.from_file(kubeconfig)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config = KubeConfig.from_service_account()
        else:
            config = KubeConfig.from_env()
        # HTTP/1.1 on a pool: with HTTP/2 a long-lived watch stream stalled the others sharing
        # its connection (lightkube's sync client); binds run concurrently on pooled connections
        self.client = Client(
            config,
            field_manager=names.EVENT_COMPONENT,
            timeout=httpx.Timeout(timeout_s),
            http2=False,
        )

    def close(self) -> None:
        self.client.close()

    # -- reads ----------------------------------------------------------------------------------

    def list_pods(self) -> tuple[list[Any], str]:
        it = self.client.list(Pod, namespace="*", chunk_size=2000)
        items = list(it)
        return items, it.resourceVersion

    def list_nodes(self) -> tuple[list[Any], str]:
        it = self.client.list(Node, chunk_size=2000)
        items = list(it)
        return items, it.resourceVersion

    def serves_pod_groups(self) -> bool:
        """Whether the API server serves Kubernetes' gang API (scheduling.k8s.io/v1beta1
        PodGroups: beta in 1.37, off unless the runtime config turns it on)."""
        try:
            found = self.get_raw("/apis/scheduling.k8s.io/v1beta1")
        except CallFailed:
            return False
        resources = found.get("resources") if found else None
        served = isinstance(resources, list) and any(
            isinstance(r, dict) and r.get("name") == "podgroups" for r in resources
        )
        if not served:
            return False
        try:  # served, but may we read them? (an older ClusterRole lacks the rule)
            self.get_raw("/apis/scheduling.k8s.io/v1beta1/podgroups?limit=1")
        except CallFailed as exc:
            if exc.code != 403:
                raise
            log.error(
                "PodGroups are served but this scheduler may not list them (grant list, watch "
                "on scheduling.k8s.io podgroups: deploy/02-rbac.yaml): gangs by annotation only"
            )
            return False
        return True

    def list_pod_groups(self) -> tuple[list[Any], str]:
        it = self.client.list(PodGroup, namespace="*", chunk_size=2000)
        items = list(it)
        return items, it.resourceVersion

    def watch_pod_groups(self, version: str) -> Iterator[tuple[str, Any]]:
        return self.client.watch(PodGroup, namespace="*", resource_version=version)

    def watch_pods(self, version: str) -> Iterator[tuple[str, Any]]:
        return self.client.watch(Pod, namespace="*", resource_version=version)

    def watch_nodes(self, version: str) -> Iterator[tuple[str, Any]]:
        return self.client.watch(Node, resource_version=version)

    # -- writes ---------------------------------------------------------------------------------
    # Writes go straight through lightkube's configured HTTP client (its base URL, TLS and
    # credentials): the answers are Status objects or whole Pods we do not need decoded, and a
    # bind's answer is a Status that lightkube would try to read as a Binding.

    def _write(
        self, method: str, path: str, body: object, content_type: str = "application/json"
    ) -> None:
        http: httpx.Client = self.client._client._client
        data = json.dumps(body).encode()
        resp = http.request(
            method,
            path,
            content=data,
            params={"fieldManager": names.EVENT_COMPONENT},
            headers={"Content-Type": content_type, "Accept": "application/json"},
        )
        if resp.status_code >= 300:
            try:
                message = str(resp.json().get("message", resp.text))
            except ValueError:
                message = resp.text
            raise CallFailed(resp.status_code, message)

    def get_raw(self, path: str) -> dict[str, object] | None:
        """A GET of any object as plain JSON; None when it does not exist (404)."""
        http: httpx.Client = self.client._client._client  # see _write
        resp = http.get(path, headers={"Accept": "application/json"})
        if resp.status_code == 404:
            return None
        if resp.status_code >= 300:
            raise CallFailed(resp.status_code, resp.text[:500])
        body = resp.json()
        return body if isinstance(body, dict) else None

    def write_raw(self, method: str, path: str, body: object) -> None:
        self._write(method, path, body)

    def write_json(
        self, method: str, path: str, body: object, content_type: str = "application/json"
    ) -> dict[str, Any]:
        """A write whose answer (the object as written) is wanted: ResourceClaim updates carry
        its resourceVersion on to the next write (kube/dra_api.py)."""
        http: httpx.Client = self.client._client._client  # see _write
        resp = http.request(
            method,
            path,
            content=json.dumps(body).encode(),
            params={"fieldManager": names.EVENT_COMPONENT},
            headers={"Content-Type": content_type, "Accept": "application/json"},
        )
        if resp.status_code >= 300:
            try:
                message = str(resp.json().get("message", resp.text))
            except ValueError:
                message = resp.text
            raise CallFailed(resp.status_code, message)
        answer = resp.json()
        return answer if isinstance(answer, dict) else {}

    def bind(self, namespace: str, pod: str, node: str, annotations: dict[str, str]) -> None:
        """One bind; the binding's annotations land on the pod in the same write (the API
        server copies them), so a bound pod always carries its placement note."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod, "namespace": namespace, "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self._write("POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/binding", body)

    def set_pending(self, namespace: str, pod: str, reason: str, message: str) -> None:
        cond = {
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastTransitionTime": _now().strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        patch = {"status": {"conditions": [cond]}}
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}/status"
        self._write("PATCH", path, patch, "application/strategic-merge-patch+json")

    def record_event(
        self, namespace: str, pod: str, uid: str, reason: str, message: str, kind: str = "Warning"
    ) -> None:
        stamp = _now().strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{pod}.{secrets.token_hex(8)}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod,
                "namespace": namespace,
                "uid": uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": names.EVENT_COMPONENT},
            "reportingComponent": names.EVENT_COMPONENT,
            "reportingInstance": _HOST,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self._write("POST", f"/api/v1/namespaces/{namespace}/events", event)

    def delete_pod(self, namespace: str, pod: str) -> None:
        self._write("DELETE", f"/api/v1/namespaces/{namespace}/pods/{pod}", {})

    def evict_pod(self, namespace: str, pod: str) -> None:
        """``policy/v1`` Eviction: the API server deletes the pod only if its
        PodDisruptionBudgets allow it, else answers 429 (the pod's own grace period holds)."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace},
        }
        self._write("POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", body)

    def annotate_pod(self, namespace: str, pod: str, key: str, value: str | None) -> None:
        patch = {"metadata": {"annotations": {key: value}}}
        self._write(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{pod}",
            patch,
            "application/merge-patch+json",
        )

    def patch_node(
        self, node: str, labels: dict[str, str | None], annotations: dict[str, str | None]
    ) -> None:
        """One merge patch of a node's labels and annotations (None removes one): a MIG
        re-cut asked of the GPU operator's MIG manager."""
        patch = {"metadata": {"labels": labels, "annotations": annotations}}
        self._write("PATCH", f"/api/v1/nodes/{node}", patch, "application/merge-patch+json")

    # -- leases (leader election) ---------------------------------------------------------------

    def get_lease(self, namespace: str, name: str) -> Any | None:
        try:
            return self.client.get(Lease, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise

    def create_lease(self, lease: Any) -> Any:
        return self.client.create(lease)

    def replace_lease(self, lease: Any) -> Any:
        return self.client.replace(lease)
