"""What the front end keeps of a Node or a Pod: the fields scheduling needs, as plain values.

The watches hand over lightkube's typed objects; these functions copy out what matters once, so
that everything downstream (the cluster model, the jobs, the tracker) is pure and testable with
values a test writes by hand, and a 10,000-pod cache holds small objects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from gpufence.kube import names
from gpufence.kube.node_rules import NodeRule, Requirement

_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$")


def quantity(text: str | int | float) -> Decimal:
    """A Kubernetes resource quantity ("500m", "64Gi", "8") as a number; ValueError if bad."""
    m = _QUANTITY.match(str(text).strip())
    if m is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 2, 500m, 64Gi)")
    try:
        return Decimal(m.group(1)) * _SUFFIX[m.group(2)]
    except InvalidOperation as exc:
        raise ValueError(f"{text!r} is not a Kubernetes quantity") from exc


def _milli(q: Decimal) -> int:
    return int((q * 1000).to_integral_value(rounding="ROUND_CEILING"))


def _mib(q: Decimal) -> int:
    return int((q / 2**20).to_integral_value(rounding="ROUND_CEILING"))


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    effect: str
    value: str = ""


@dataclass(frozen=True, slots=True)
class ObservedNode:
    name: str
    labels: dict[str, str]
    gpus: int  # allocatable nvidia.com/gpu
    mig: dict[str, int]  # MIG profile ("1g.10gb") -> allocatable instances
    cpu_milli: int
    mem_mib: int
    ready: bool
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    mig_recut: str = ""  # the gpufence.io/mig-recut annotation (kube/mig_recut.py)


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""  # empty with operator Exists: tolerates every taint
    operator: str = "Equal"
    value: str = ""
    effect: str = ""  # empty: every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True, slots=True)
class ObservedPod:
    namespace: str
    name: str
    uid: str
    scheduler_name: str
    node: str  # spec.nodeName ("" while unbound)
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    deleting: bool  # metadata.deletionTimestamp is set
    labels: dict[str, str]
    annotations: dict[str, str]
    # summed over the containers (init containers: the largest, as the kubelet counts them)
    requests: dict[str, Decimal] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    created: float = 0.0  # creationTimestamp, seconds since the epoch
    group: str = ""  # spec.schedulingGroup.podGroupName: Kubernetes' own gang API (a PodGroup)
    owner: str = ""  # "<Kind>/<uid>" of its controller (a Job, a JobSet's Job, a ReplicaSet)
    node_rule: NodeRule = field(default_factory=NodeRule)  # nodeSelector, required affinity
    # spec.resourceClaims (DRA): (its name in the pod, the ResourceClaim's name; "" while the
    # claim controller has not made the claim of a template yet)
    claims: tuple[tuple[str, str], ...] = ()
    # the whole GPUs those claims ask for, or why they cannot be read (kube/dra.py sets it)
    claim_gpus: int | str = 0
    claim_mig: str = ""  # or the one MIG profile they ask for ("1g.10gb")

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def cpu_milli(self) -> int:
        return _milli(self.requests.get("cpu", Decimal(0)))

    def mem_mib(self) -> int:
        return _mib(self.requests.get("memory", Decimal(0)))


def _resources(container: Any) -> dict[str, Decimal]:
    """A container's requests, falling back to its limits (Kubernetes defaults requests to
    limits for extended resources such as nvidia.com/gpu, which may be given as limits only)."""
    res = container.resources
    out: dict[str, Decimal] = {}
    if res is None:
        return out
    for source in (res.limits or {}, res.requests or {}):
        for key, value in source.items():
            out[key] = quantity(value)
    return out


def pod_requests(spec: Any) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for c in spec.containers or ():
        for key, value in _resources(c).items():
            total[key] = total.get(key, Decimal(0)) + value
    for c in spec.initContainers or ():
        for key, value in _resources(c).items():
            total[key] = max(total.get(key, Decimal(0)), value)
    return total


def observe_pod(pod: Any) -> ObservedPod:
    """Copy a lightkube Pod into an ObservedPod. A malformed quantity is kept out of the
    requests (the API server validates quantities, so it cannot come from a real server)."""
    meta, spec, status = pod.metadata, pod.spec, pod.status
    created = meta.creationTimestamp.timestamp() if meta.creationTimestamp else 0.0
    tolerations = tuple(
        Toleration(t.key or "", t.operator or "Equal", t.value or "", t.effect or "")
        for t in (spec.tolerations or ())
    )
    return ObservedPod(
        namespace=meta.namespace or "default",
        name=meta.name or "",
        uid=meta.uid or "",
        scheduler_name=spec.schedulerName or "default-scheduler",
        node=spec.nodeName or "",
        phase=(status.phase if status is not None else None) or "Pending",
        deleting=meta.deletionTimestamp is not None,
        labels=dict(meta.labels or {}),
        annotations=dict(meta.annotations or {}),
        requests=pod_requests(spec),
        tolerations=tolerations,
        created=created,
        group=(spec.schedulingGroup.podGroupName or "") if spec.schedulingGroup else "",
        owner=controller_of(meta),
        node_rule=node_rule_of(spec),
        claims=pod_claims(spec, status),
    )


def pod_claims(spec: Any, status: Any) -> tuple[tuple[str, str], ...]:
    """A pod's ResourceClaims: one it names (``resourceClaimName``), or the one the claim
    controller made from its template (named in ``status.resourceClaimStatuses``)."""
    made = {
        s.name: s.resourceClaimName or ""
        for s in ((status.resourceClaimStatuses if status is not None else None) or ())
    }
    return tuple(
        (c.name, c.resourceClaimName or made.get(c.name, "")) for c in spec.resourceClaims or ()
    )


def controller_of(meta: Any) -> str:
    """Who makes the pod again when its job is requeued: ``"<Kind>/<uid>"`` of its controller
    (a Job, a ReplicaSet), or for a JobSet's pod (Pod -> Job -> JobSet, named by the label
    JobSet puts on its Jobs' pods) ``"JobSet/<namespace>/<name>"``: a JobSet restarts by
    making its child Jobs anew (new uids), so their Job is not what stays."""
    ctrl = next((o for o in meta.ownerReferences or () if o.controller), None)
    if ctrl is None:
        return ""
    jobset = (meta.labels or {}).get(names.LABEL_JOBSET_NAME)
    if ctrl.kind == "Job" and jobset:
        return f"JobSet/{meta.namespace or 'default'}/{jobset}"
    return f"{ctrl.kind}/{ctrl.uid}"


def _requirements(entries: Any, field: bool) -> tuple[Requirement, ...]:
    return tuple(
        Requirement(e.key, e.operator, tuple(e.values or ()), field) for e in entries or ()
    )


def node_rule_of(spec: Any) -> NodeRule:
    """A pod spec's hard node constraints (preferred affinity is a preference: not kept)."""
    selector = tuple(sorted((spec.nodeSelector or {}).items()))
    affinity = spec.affinity.nodeAffinity if spec.affinity is not None else None
    required = affinity.requiredDuringSchedulingIgnoredDuringExecution if affinity else None
    terms = tuple(
        _requirements(t.matchExpressions, False) + _requirements(t.matchFields, True)
        for t in (required.nodeSelectorTerms if required is not None else ())
    )
    return NodeRule(selector, terms)


@dataclass(frozen=True, slots=True)
class ObservedPodGroup:
    """A scheduling.k8s.io PodGroup: ``min_count`` pods all-or-nothing (None: no gang policy,
    its pods are scheduled one by one)."""

    namespace: str
    name: str
    min_count: int | None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def observe_pod_group(group: Any) -> ObservedPodGroup:
    policy = group.spec.schedulingPolicy if group.spec else None
    gang = policy.gang if policy is not None else None
    return ObservedPodGroup(
        namespace=group.metadata.namespace or "default",
        name=group.metadata.name or "",
        min_count=int(gang.minCount) if gang is not None else None,
    )


def _ready(status: Any) -> bool:
    for cond in (status.conditions if status is not None else None) or ():
        if cond.type == "Ready":
            return bool(cond.status == "True")
    return False


def observe_node(node: Any) -> ObservedNode:
    meta, spec, status = node.metadata, node.spec, node.status
    alloc = {k: quantity(v) for k, v in ((status.allocatable if status else None) or {}).items()}
    mig = {
        key.removeprefix(names.RES_MIG_PREFIX): int(value)
        for key, value in alloc.items()
        if key.startswith(names.RES_MIG_PREFIX) and value > 0
    }
    taints = tuple(
        Taint(t.key, t.effect, t.value or "") for t in ((spec.taints if spec else None) or ())
    )
    return ObservedNode(
        name=meta.name or "",
        labels=dict(meta.labels or {}),
        gpus=int(alloc.get(names.RES_GPU, Decimal(0))),
        mig=mig,
        cpu_milli=_milli(alloc.get("cpu", Decimal(0))),
        mem_mib=_mib(alloc.get("memory", Decimal(0))),
        ready=_ready(status),
        unschedulable=bool(spec.unschedulable) if spec else False,
        taints=taints,
        mig_recut=(meta.annotations or {}).get(names.ANN_MIG_RECUT, ""),
    )
