"""What the front end asks of the API server: plain values, made by the tracker, carried out
by kube/api_actions.py. Keeping them as data keeps the tracker free of I/O (and testable by
comparing lists)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufence.kube.dra_objects import ClaimRelease, ClaimWrite
from gpufence.kube.mig_parted import ConfigWrite
from gpufence.kube.placement_notes import BindNote


@dataclass(frozen=True, slots=True)
class BindPod:
    namespace: str
    pod: str
    node: str
    note: BindNote
    claims: tuple[ClaimWrite, ...] = ()  # DRA: its claims' allocation, written before the bind


@dataclass(frozen=True, slots=True)
class DeletePod:
    """Stop a running pod (a preemption, a reclaim, a node failure, half a gang)."""

    namespace: str
    pod: str
    why: str


@dataclass(frozen=True, slots=True)
class EvictPod:
    """Stop a running pod the core decided to stop (preemption, reclaim, a node failure) through
    the Eviction API, so that its PodDisruptionBudget is honoured: a refused eviction is retried,
    never replaced by a delete."""

    namespace: str
    pod: str
    why: str


@dataclass(frozen=True, slots=True)
class ShowPending:
    """Set PodScheduled=False with this reason and message, and record an Event."""

    namespace: str
    pod: str
    reason: str  # Unschedulable | gpufence/Rejected
    message: str
    # the message without what changes by itself (a countdown): a pod's condition and Event are
    # rewritten when this changes, not every time the countdown ticks ("" = the message)
    gist: str = ""


@dataclass(frozen=True, slots=True)
class AnnotatePod:
    """Set (value) or remove (None) one annotation: preemption notices."""

    namespace: str
    pod: str
    key: str
    value: str | None
    event: str = ""  # also record an Event with this message


@dataclass(frozen=True, slots=True)
class LabelNode:
    """Set (value) or remove (None) a node's labels and annotations in one patch: a MIG re-cut
    asked of the GPU operator's MIG manager (kube/mig_recut.py)."""

    node: str
    labels: dict[str, str | None]
    annotations: dict[str, str | None]
    # written into the MIG manager's ConfigMap first (k8s run --mig-configmap): None = the
    # config is expected in a pre-installed catalogue
    config: ConfigWrite | None = None


@dataclass(frozen=True, slots=True)
class PodEvent:
    """Record an Event on a pod (a MIG re-cut that failed)."""

    namespace: str
    pod: str
    reason: str
    message: str


Action = (
    BindPod | DeletePod | EvictPod | ShowPending | AnnotatePod | LabelNode | PodEvent | ClaimRelease
)
