"""The API server's audit log, for tests that assert exactly which writes a scheduler made.

``apiserver_args(work)`` turns on the log backend with a policy that records, at ``Request``
level (the body included), every write of the user ``gpufence-scheduler`` and nothing else; a
test runs gpufence under that user (``grant_scheduler``: cluster-admin, so the test is about
what it writes, not what RBAC allows; tests/k8s/test_k8s_deploy.py checks deploy/'s RBAC) and
reads its writes with ``writes``.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kobjects as k
from cluster import GPUFENCE_SCHEDULER_USER, KubeCluster

POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    users: [{GPUFENCE_SCHEDULER_USER}]
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
"""


def apiserver_args(work: Path) -> list[str]:
    work.mkdir(parents=True, exist_ok=True)
    policy = work / "audit-policy.yaml"
    policy.write_text(POLICY)
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={work / 'audit.log'}",
        "--audit-log-mode=blocking",
    ]


def grant_scheduler(kc: KubeCluster) -> None:
    body = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "test-gpufence-scheduler-admin"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "cluster-admin",
        },
        "subjects": [
            {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "User",
                "name": GPUFENCE_SCHEDULER_USER,
            }
        ],
    }
    k.ok(kc, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body, 201)


@dataclass(frozen=True)
class Write:
    """One write the scheduler made (a ResponseComplete audit event)."""

    verb: str
    resource: str  # "pods", "pods/eviction", "pods/status", "events", "leases", ...
    namespace: str
    name: str
    code: int
    body: Any  # the request object
    at: float = 0.0  # when the API server answered (seconds since the epoch)

    def __str__(self) -> str:
        return f"{self.verb} {self.resource} {self.namespace}/{self.name} -> {self.code}"


def writes(kc: KubeCluster, namespace: str) -> list[Write]:
    """The scheduler's writes in ``namespace`` so far, in order."""
    return [w for w in all_writes(kc) if w.namespace == namespace]


def all_writes(kc: KubeCluster) -> list[Write]:
    """The scheduler's writes so far, in order; cluster-scoped objects (nodes) with namespace
    "" and ``at`` the time the API server answered."""
    path = kc.work_dir / "audit.log"
    out = []
    for line in path.read_text().splitlines() if path.exists() else ():
        ev = json.loads(line)
        ref = ev.get("objectRef") or {}
        if ev.get("stage") != "ResponseComplete":
            continue
        sub = ref.get("subresource")
        out.append(
            Write(
                verb=ev["verb"],
                resource=f"{ref.get('resource')}/{sub}" if sub else str(ref.get("resource")),
                namespace=str(ref.get("namespace") or ""),
                name=str(
                    ref.get("name")
                    or (ev.get("requestObject") or {}).get("metadata", {}).get("name", "")
                ),
                code=int((ev.get("responseStatus") or {}).get("code", 0)),
                body=ev.get("requestObject"),
                at=_seconds(str(ev.get("stageTimestamp", ""))),
            )
        )
    return out


def _seconds(stamp: str) -> float:
    try:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
