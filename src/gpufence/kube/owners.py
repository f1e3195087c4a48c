"""Requeued jobs whose controller will never make their next attempt.

A checkpointable job stopped by the core (an incident, a reclaim, a defrag) stays the core's
job, held, until its controller's new pods come (kube/tracker.py, ``_requeue``). A controller
that is gone or done makes none: the Job deleted by hand meanwhile (``kubectl delete job``), a
Job that counted the eviction as a failure past its ``backoffLimit`` (the Job controller marks
it ``Failed``; a Job without a ``podFailurePolicy`` ignoring ``DisruptionTarget`` does), a
Deployment scaled to zero, a JobSet deleted. Without this check the job would wait, held,
forever: counted as pending, kept in the state Lease across restarts, its next attempt's id
reserved.

Why a periodic look and not a watch of every Job and ReplicaSet in the cluster: only the few
requeued jobs need it, and only while they wait (seconds, normally: controllers answer fast),
so a LIST of their namespaces' controllers every ``every_s`` costs nothing when none waits and
keeps no cache of the cluster's Jobs. A controller is judged only after it had ``grace_s`` to
make its pods, so a restart's look does not race the controller.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from gpufence.kube.api import CallFailed

log = logging.getLogger("gpufence.kube")

# the collections a controller of each kind is listed from (namespaced; {ns} filled in)
COLLECTIONS = {
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
    "ReplicaSet": "/apis/apps/v1/namespaces/{ns}/replicasets",
    "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
}
JOBSET_API = "/apis/jobset.x-k8s.io/v1alpha2"
JOBSET = JOBSET_API + "/namespaces/{ns}/jobsets/{name}"


class Getter(Protocol):
    def get_raw(self, path: str) -> dict[str, object] | None: ...


def _done(conditions: Any, kinds: tuple[str, ...]) -> str:
    """The first of ``kinds`` among an object's true status conditions, with its reason."""
    for c in conditions or ():
        if isinstance(c, dict) and c.get("type") in kinds and c.get("status") == "True":
            why = c.get("reason") or ""
            return f"{str(c['type']).lower()}" + (f" ({why})" if why else "")
    return ""


def why_finished(kind: str, obj: Mapping[str, Any]) -> str:
    """Why a controller that exists will make no more pods ("" when it still may)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if kind in ("Job", "JobSet"):
        return _done(status.get("conditions"), ("Failed", "Complete", "Completed"))
    if kind in ("ReplicaSet", "StatefulSet") and spec.get("replicas") == 0:
        return "scaled to 0 replicas"
    return ""


class OwnerCheck:
    """Which awaited controllers are gone or done, looked at every ``every_s`` seconds."""

    def __init__(self, api: Getter, every_s: float = 10.0, grace_s: float = 10.0) -> None:
        self.api, self.every_s, self.grace_s = api, every_s, grace_s
        self.first_seen: dict[str, float] = {}  # owner -> when it was first seen awaited
        self.next_look = 0.0

    def gone(self, awaiting: Mapping[str, tuple[str, int]], now: float) -> dict[str, str]:
        """Owner -> why it will make no pods, for the owners of ``awaiting`` (owner -> (job
        id, next attempt), kube/tracker.py ``awaiting``) that waited ``grace_s`` at least."""
        self.first_seen = {o: self.first_seen.get(o, now) for o in awaiting}
        due = [o for o, t in self.first_seen.items() if now - t >= self.grace_s]
        if not due or now < self.next_look:
            return {}
        self.next_look = now + self.every_s
        listed: dict[str, dict[str, Mapping[str, Any]]] = {}
        out: dict[str, str] = {}
        for owner in sorted(due):
            namespace = awaiting[owner][0].split("/", 1)[0]
            try:
                why = self._why(owner, namespace, listed)
            except Exception as e:  # RBAC, the API server away, a body that is not JSON:
                # judge nothing and look again; the scheduler's loop must go on
                log.warning("cannot read the controller %s of a requeued job: %s", owner, e)
                continue
            if why:
                out[owner] = why
        return out

    def _why(
        self, owner: str, namespace: str, listed: dict[str, dict[str, Mapping[str, Any]]]
    ) -> str:
        kind, _, rest = owner.partition("/")
        if kind == "JobSet":
            ns, _, name = rest.partition("/")
            obj = self.api.get_raw(JOBSET.format(ns=ns, name=name))
            if obj is None and self.api.get_raw(JOBSET_API) is None:
                # a 404 because the JobSet API is not served here (another version, the CRD
                # gone) says nothing of this JobSet
                raise CallFailed(404, f"{JOBSET_API} is not served")
            return "deleted" if obj is None else why_finished(kind, obj)
        collection = COLLECTIONS.get(kind)
        if collection is None:
            return ""  # a controller kind gpufence does not know: it is left to make its pods
        path = collection.format(ns=namespace)
        if path not in listed:
            body = self.api.get_raw(path)
            items = body.get("items") if body is not None else None
            if not isinstance(items, list):  # no list at all: nothing can be judged from it
                raise CallFailed(404, f"{path} gave no list of {kind}s")
            listed[path] = {
                str(i["metadata"]["uid"]): i
                for i in items
                if isinstance(i, dict) and isinstance(i.get("metadata"), dict)
            }
        found = listed[path].get(rest)
        return "deleted" if found is None else why_finished(kind, found)
