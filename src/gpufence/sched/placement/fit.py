"""Shared placement types, the placer Protocol and node filters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpufence.model.decisions import Assignment, Reason
from gpufence.model.job import Job, RequestKind
from gpufence.state.ledger import Ledger


@dataclass(frozen=True, slots=True)
class Placed:
    assignments: tuple[Assignment, ...]


@dataclass(frozen=True, slots=True)
class NotPlaced:
    reason: Reason
    message: str


PlaceResult = Placed | NotPlaced


def node_admits(ledger: Ledger, job: Job, node: int, replicas: int = 1) -> bool:
    """Node is up, of an allowed GPU type, and has CPU and memory for ``replicas`` replicas."""
    if not ledger.node_up[node]:
        return False
    n = ledger.cluster.nodes[node]
    if job.gpu_types and n.gpu_type not in job.gpu_types:
        return False
    return (
        ledger.cpu_free(node) >= job.cpu_milli * replicas
        and ledger.mem_free(node) >= job.mem_mib * replicas
    )


def replicas_by_host(ledger: Ledger, job: Job, node: int) -> int:
    """How many replicas the node's CPU and memory could host (GPUs aside)."""
    cpu = ledger.cpu_free(node) // job.cpu_milli if job.cpu_milli else 1 << 30
    mem = ledger.mem_free(node) // job.mem_mib if job.mem_mib else 1 << 30
    return min(cpu, mem)


class Placer(Protocol):
    """Placement for one sharing mode (registered per mode in ``sched/registry.py``): where a
    whole gang of ``job`` fits in ``pool`` now, without changing the ledger, or why not."""

    offers: frozenset[RequestKind]  # the request kinds a partition of this mode can hold

    def place(self, ledger: Ledger, job: Job, pool: str) -> PlaceResult: ...


def refusal(pool: str, kind: RequestKind, offers: frozenset[RequestKind]) -> str | None:
    """Why a partition that offers ``offers`` cannot hold a request of ``kind`` (None: it can)."""
    if kind in offers:
        return None
    if kind is RequestKind.MIG:
        return f"{pool} has no MIG instances"
    if RequestKind.MIG in offers:
        return f"{pool} offers only MIG instances"
    return f"{pool} does not share GPUs by fraction"
