"""GPU capacity measures: allocation, utilisation, fragmentation, the largest placeable gang.

A pool is described by its nodes, each as the free capacity of its GPUs in milli-GPUs (1000 =
a whole free GPU; 0 = taken, held for a waiting gang, on a down node, or being re-partitioned)
— plain data that the simulator and the control plane both read off their ledger.

**Fragmentation** (one definition, FGD's — Weng et al., USENIX ATC'23, the measure
``bench/openb.py`` reproduces): the free capacity that a request drawn from a *reference
workload* cannot use, as a share of the pool's capacity. A request of ``gpus`` GPUs of
``milli`` each can use a node's free GPUs only if at least ``gpus`` of them have ``milli``
free; otherwise all the node's free capacity is a fragment for it, else the free capacity on
the GPUs too small for it is. The reference workload:

* the openb benchmark: the trace's typical pods (with their CPU and GPU-type needs);
* the simulator and the control plane: the pool's largest unit — **a whole node** for exclusive
  and time-sliced pools (the free GPUs on partly used nodes: what an 8-GPU gang cannot use),
  **a whole GPU** for MIG and fractional pools (the free slices / milli on partly used GPUs).

The **largest placeable gang** is the most whole free GPUs on one node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

WHOLE = 1000  # milli-GPUs in a GPU


@dataclass(frozen=True, slots=True)
class Demand:
    """One request of a reference workload and its probability."""

    milli: int  # per GPU; 1000 for whole GPUs, 0 for CPU-only
    gpus: int  # 0 for CPU-only; -1 = every GPU of the node (a whole-node request)
    weight: float = 1.0
    cpu_milli: int = 0
    gpu_types: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeFree:
    """Free capacity of one node of a pool."""

    free: tuple[int, ...]  # milli free per GPU of the pool on this node
    cpu_free: int = 1 << 62
    gpu_type: str = ""


def allocation_ratio(used: float, capacity: float) -> float:
    """Allocated / capacity (GPU-equivalents or GPU-seconds); 0 for an empty pool."""
    return used / capacity if capacity > 0 else 0.0


def utilization(busy_gpu_s: float, capacity_gpu_s: float) -> float:
    """GPU-time doing work (an idle notebook's GPU is allocated, not busy) / capacity time."""
    return busy_gpu_s / capacity_gpu_s if capacity_gpu_s > 0 else 0.0


def unusable(node: NodeFree, d: Demand) -> int:
    """Free milli of ``node`` that request ``d`` cannot use (FGD's per-request fragment)."""
    total = sum(node.free)
    if d.gpus == 0:
        return total
    if (d.gpu_types and node.gpu_type not in d.gpu_types) or node.cpu_free < d.cpu_milli:
        return total
    need = len(node.free) if d.gpus < 0 else d.gpus
    big = [f for f in node.free if f >= d.milli]
    if len(big) >= need:
        return total - sum(big)
    return total


def fragment_milli(nodes: Iterable[NodeFree], workload: Sequence[Demand]) -> float:
    """Expected free milli a request of ``workload`` cannot use, summed over the nodes."""
    norm = sum(d.weight for d in workload)
    if norm <= 0:
        return 0.0
    return sum(d.weight * unusable(n, d) for n in nodes for d in workload) / norm


def fragmentation(
    nodes: Sequence[NodeFree], workload: Sequence[Demand], capacity_milli: int
) -> float:
    """Fragmented share of a pool's capacity (0..1) against a reference workload."""
    if capacity_milli <= 0:
        return 0.0
    return fragment_milli(nodes, workload) / capacity_milli


WHOLE_NODE = (Demand(WHOLE, -1),)
WHOLE_GPU = (Demand(WHOLE, 1),)


def reference_workload(sharing: str) -> tuple[Demand, ...]:
    """The pool's largest unit by sharing mode: a whole GPU for ``mig`` / ``fractional``, a
    whole node otherwise."""
    return WHOLE_GPU if sharing in ("mig", "fractional") else WHOLE_NODE


def pool_fragmentation(nodes: Sequence[Sequence[int]], sharing: str) -> float:
    """Fragmentation of a pool given each node's free milli per GPU (its capacity is
    1000 × its GPUs): ``fragmentation`` against ``reference_workload(sharing)``, with the sums
    written out for the two one-request references (the simulator samples it often)."""
    cap = WHOLE * sum(len(n) for n in nodes)
    if cap <= 0:
        return 0.0
    if reference_workload(sharing) is WHOLE_GPU:  # the free milli of partly free GPUs
        frag = sum(f for n in nodes for f in n if f < WHOLE)
    else:  # a whole node: all free capacity of a node that is not entirely free
        frag = sum(sum(n) for n in nodes if any(f < WHOLE for f in n))
    return frag / cap


def whole_gpu_pool(free_whole: Sequence[int], sizes: Sequence[int]) -> tuple[float, int]:
    """(fragmentation, largest placeable gang) of an exclusive or time-sliced pool from each
    node's count of whole free GPUs and its GPUs in the pool: the definitions above for rows
    that hold only 0 and 1000 (the simulator samples 1,000-node pools often)."""
    cap = WHOLE * sum(sizes)
    frag = sum(k for k, n in zip(free_whole, sizes, strict=True) if k < n) * WHOLE
    return (frag / cap if cap > 0 else 0.0), max(free_whole, default=0)


def largest_placeable_gang(nodes: Iterable[Sequence[int]]) -> int:
    """Whole free GPUs of the best node: the largest single-node gang that fits now."""
    return max((sum(1 for f in n if f >= WHOLE) for n in nodes), default=0)
