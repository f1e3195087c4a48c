"""Bookkeeping of the Ray executor (``ray_executor.py``) that needs no Ray: the attempt table's
records, members grouped by node agent, and how ``ray.nodes()`` changes become node up / down.
(The member environments are ``executors/memberenv.py``'s, shared with the local executor.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufence.control.executors.gang import GangState
from gpufence.control.executors.ray.nodes import RayNode

Key = tuple[str, int]


@dataclass(eq=False, slots=True)
class RayMember:
    rank: int
    node: str
    node_id: str
    agent: Any
    done: bool = False
    code: int | None = None
    oom: bool = False
    strays: int = 0
    stop: bool | None = None
    """Whether a stop reached it before its command exited (its launcher's record)."""


@dataclass(eq=False, slots=True)
class RayAttempt(GangState):
    members: list[RayMember] = field(default_factory=list)
    hold_until: float | None = None
    """A member's node was lost: the attempt waits until then for the node to come back."""
    ack_refs: list[Any] = field(default_factory=list)

    def live(self) -> list[RayMember]:
        return [m for m in self.members if not m.done]


def by_agent(members: list[RayMember]) -> dict[str, tuple[Any, list[int]]]:
    out: dict[str, tuple[Any, list[int]]] = {}
    for m in members:
        if m.agent is not None:
            out.setdefault(m.node_id, (m.agent, []))[1].append(m.rank)
    return out


def where(att: RayAttempt) -> str:
    return " ".join(f"{m.node}" for m in att.members)


def short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"


def node_changes(
    nodes: dict[str, RayNode], up: dict[str, bool], now_nodes: list[RayNode]
) -> list[tuple[str, bool, str]]:
    """Compare the executor's nodes with ``ray.nodes()`` now: ``(name, up, old node id)`` for each
    change, updating ``nodes`` (a node back under a new Ray node id) and ``up`` in place."""
    alive = {n.node_id: n for n in now_nodes if n.alive}
    by_label = {n.label: n for n in alive.values() if n.label}
    changes: list[tuple[str, bool, str]] = []
    for name, node in list(nodes.items()):
        cur = alive.get(node.node_id)
        if cur is None and node.label is not None:
            cur = by_label.get(node.label)  # the same node, restarted with a new id
        was = up[name]
        if cur is not None and cur.node_id != node.node_id:
            if was:
                changes.append((name, False, node.node_id))
            nodes[name] = cur
            changes.append((name, True, node.node_id))
            up[name] = True
        elif (cur is not None) != was:
            up[name] = cur is not None
            changes.append((name, cur is not None, node.node_id))
    return changes
