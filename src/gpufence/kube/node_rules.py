"""A pod's own node constraints (``spec.nodeSelector`` and required node affinity) in terms the
core can keep: a set of GPU types.

The core places a job by partition (the fences) and, within it, by GPU type; it has no per-job
node list. So a pod's constraint is evaluated against the GPU nodes as they are, and:
* if every GPU node satisfies it (``kubernetes.io/os: linux`` and the like), it constrains
  nothing;
* if the nodes it selects are exactly the nodes of some GPU types (``nvidia.com/gpu.product``,
  or any label that follows the product), it becomes those types -- placement then honours it
  exactly;
* anything else (a subset that cuts across types, or no GPU node at all) is refused on the pod,
  naming what it selects and the fix. Silently dropping it would bind the pod where its kubelet
  refuses it (the kubelet re-checks selectors and affinity at admission).

Preferred (soft) affinity is a preference only, and gpufence's own placement decides instead;
the README says so. Node labels changing rebuild the model, which reads every pod again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``matchExpressions``/``matchFields`` entry of a node selector term."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()
    field: bool = False  # matchFields (only metadata.name exists): the node's name, not a label


@dataclass(frozen=True, slots=True)
class NodeRule:
    """What a pod asks of its node: every ``selector`` entry, and one of ``terms`` (each term
    all of its requirements) when there are any."""

    selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[tuple[Requirement, ...], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.selector or self.terms)


@dataclass(frozen=True, slots=True)
class GpuNodeFacts:
    """A GPU node as the rule sees it: its labels and the catalogue type of its GPUs."""

    labels: Mapping[str, str]
    gpu_type: str


def _integer(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _requirement_holds(req: Requirement, name: str, labels: Mapping[str, str]) -> bool:
    if req.field:
        value: str | None = name if req.key == "metadata.name" else None
    else:
        value = labels.get(req.key)
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(req.values) == 1:
        have, bound = _integer(value), _integer(req.values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def matches(rule: NodeRule, name: str, labels: Mapping[str, str]) -> bool:
    """Whether node ``name`` with ``labels`` satisfies ``rule`` (Kubernetes' semantics: the
    selector's entries all, and any one term wholly; an empty term matches nothing)."""
    if any(labels.get(k) != v for k, v in rule.selector):
        return False
    if not rule.terms:
        return True
    return any(
        term and all(_requirement_holds(r, name, labels) for r in term) for term in rule.terms
    )


def _describe(rule: NodeRule) -> str:
    parts = [f"spec.nodeSelector {k}={v}" for k, v in rule.selector]
    if rule.terms:
        parts.append("spec.affinity.nodeAffinity (required)")
    return " and ".join(parts)


def gpu_types_for(rule: NodeRule, nodes: Mapping[str, GpuNodeFacts]) -> tuple[str, ...]:
    """The GPU types ``rule`` amounts to on ``nodes`` (``()``: no constraint), or ValueError
    naming what it selects and the fix."""
    if not rule or not nodes:
        return ()
    chosen = {n for n, facts in nodes.items() if matches(rule, n, facts.labels)}
    if len(chosen) == len(nodes):
        return ()
    what = _describe(rule)
    if not chosen:
        raise ValueError(
            f"{what} selects none of the {len(nodes)} GPU nodes: fix the labels it asks for, "
            "or remove it"
        )
    types = {nodes[n].gpu_type for n in chosen}
    same_types = {n for n, facts in nodes.items() if facts.gpu_type in types}
    if same_types == chosen:
        return tuple(sorted(types))
    left_out = sorted(same_types - chosen)
    raise ValueError(
        f"{what} selects {len(chosen)} of the {len(nodes)} GPU nodes, not whole GPU types "
        f"(it leaves out {_sample(left_out)} of type {', '.join(sorted(types))}): gpufence "
        "honours a pod's node constraint only as GPU types (nvidia.com/gpu.product); select "
        "other nodes with a fence's node_selector and the pod's gpufence.io/partition label"
    )


def _sample(names: Iterable[str], shown: int = 3) -> str:
    listed = list(names)
    head = ", ".join(listed[:shown])
    return head + (f" and {len(listed) - shown} more" if len(listed) > shown else "")
