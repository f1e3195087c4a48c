"""Play what the test harness lacks, by hand: the kubelets of fake GPU nodes and the ReplicaSet
controller (``python tests/k8s/cluster.py`` runs only etcd and kube-apiserver).

    export KUBECONFIG=...                   # what cluster.py printed
    python tests/k8s/play.py nodes serving-0=serving:4 training-0=training:4 training-1=training:4
    python tests/k8s/play.py replicas online/llm

``nodes NAME=FENCE:GPUS ...`` creates Ready nodes labelled ``gpufence.io/fence=FENCE`` with GPUS
allocatable ``nvidia.com/gpu``. ``replicas NS/DEPLOYMENT`` creates the Deployment's pods from its
template, as its ReplicaSet would. A pod's phase is set with kubectl itself:
``kubectl patch pod P --subresource=status --type=merge -p '{"status":{"phase":"Running"}}'``.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import sys
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import kobjects as k
import yaml


class KubeconfigClient:
    """The ``request`` of cluster.KubeCluster, for a kubeconfig of the harness (a server, its
    CA file, a bearer token): enough for kobjects' helpers."""

    def __init__(self, path: str) -> None:
        with open(path) as f:
            cfg = yaml.safe_load(f)
        cluster = cfg["clusters"][0]["cluster"]
        self.token = cfg["users"][0]["user"]["token"]
        url = urlsplit(cluster["server"])
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self._ssl = ssl.create_default_context(cafile=cluster["certificate-authority"])

    def request(
        self,
        method: str,
        path: str,
        obj: Any = None,
        *,
        token: str | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        conn = http.client.HTTPSConnection(self.host, self.port, context=self._ssl, timeout=30)
        try:
            headers = {
                "Authorization": f"Bearer {token or self.token}",
                "Accept": "application/json",
            }
            body = None
            if obj is not None:
                body = json.dumps(obj).encode()
                headers["Content-Type"] = content_type
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
        finally:
            conn.close()


def make_nodes(kc: Any, specs: Sequence[str]) -> list[str]:
    out = []
    for spec in specs:
        name, _, rest = spec.partition("=")
        fence, _, gpus = rest.partition(":")
        if not name or not fence or not gpus.isdigit():
            raise SystemExit(f"{spec!r}: give NAME=FENCE:GPUS, e.g. training-0=training:8")
        k.gpu_node(kc, name, gpus=int(gpus), labels={"gpufence.io/fence": fence})
        out.append(name)
    return out


def replica_pods(kc: Any, deployment: dict[str, Any], prefix: str = "") -> list[str]:
    """The pods a ReplicaSet of ``deployment`` would make: its template, named PREFIX-0 ..
    PREFIX-(replicas-1); those that exist already are left alone (after a scale-up, only the
    new ones are made). Returns the names made."""
    tmpl = deployment["spec"]["template"]
    ns = deployment["metadata"]["namespace"]
    prefix = prefix or deployment["metadata"]["name"]
    made = []
    for i in range(deployment["spec"].get("replicas", 1)):
        meta = {**tmpl.get("metadata", {}), "name": f"{prefix}-{i}"}
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": tmpl["spec"]}
        status, answer = kc.request("POST", f"/api/v1/namespaces/{ns}/pods", body)
        if status == 201:
            made.append(meta["name"])
        elif status != 409:
            raise SystemExit(f"creating pod {ns}/{meta['name']}: {status} {answer}")
    return made


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("nodes", "replicas"):
        print(__doc__, file=sys.stderr)
        return 2
    config = os.environ.get("KUBECONFIG")
    if not config:
        print("set KUBECONFIG to the file tests/k8s/cluster.py printed", file=sys.stderr)
        return 2
    kc = KubeconfigClient(config)
    if argv[0] == "nodes":
        for name in make_nodes(kc, argv[1:]):
            print(f"node/{name} created")
        return 0
    for ref in argv[1:]:
        ns, _, name = ref.partition("/")
        dep = k.ok(kc, "GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")
        for pod in replica_pods(kc, dep):
            print(f"pod/{pod} created in {ns}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
