"""Shared placement types and node filters."""

from __future__ import annotations

from dataclasses import dataclass

from gpufence.model.decisions import Assignment, Reason
from gpufence.model.job import Job
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
