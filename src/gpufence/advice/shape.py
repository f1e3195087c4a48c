"""Facts about a cluster's fences that several rules need: capacities, lending, quotas, racks."""

from __future__ import annotations

from gpufence.model.cluster import Cluster
from gpufence.model.job import MILLI_PER_GPU, WorkloadClass
from gpufence.model.partition import SharingMode


def slots(cluster: Cluster, p: str) -> int:
    """Whole-GPU places of a partition (time-sliced GPUs count each share)."""
    part = cluster.partitions[p]
    n = len(cluster.partition_gpus[p])
    return n * part.time_slice_max if part.sharing is SharingMode.TIME_SLICE else n


def lent_in(cluster: Cluster, p: str) -> list[tuple[str, int, int]]:
    """(lender, rule index, cap GPUs) of every lending rule that lends to ``p``."""
    return [
        (name, k, rule.cap_gpus)
        for name, part in cluster.partitions.items()
        for k, rule in enumerate(part.lending)
        if p in rule.to and name != p
    ]


def serving_partitions(cluster: Cluster) -> list[str]:
    return [p for p, part in cluster.partitions.items() if WorkloadClass.SERVING in part.admits]


def admitting(cluster: Cluster, cls: WorkloadClass, exclude: str = "") -> list[str]:
    return [p for p, part in cluster.partitions.items() if cls in part.admits and p != exclude]


def racks_of(cluster: Cluster, p: str) -> set[str]:
    return {cluster.nodes[n].rack for n in cluster.partition_nodes[p]}


def node_gpus(cluster: Cluster, p: str) -> int:
    """GPUs of the partition on its biggest node: what one node failure takes away."""
    return cluster.max_gpus_per_node(p)


def _gpus(milli: int | None) -> float | None:
    return None if milli is None else milli / MILLI_PER_GPU


def quota_max(cluster: Cluster, queue: str) -> float | None:
    """Most GPUs a queue's jobs may hold by quota (nominal + what it may borrow); None = no
    quota, only capacity limits it."""
    q = cluster.queues[queue]
    nominal = _gpus(q.nominal_milli)
    if nominal is None:
        return None
    if q.borrowing_limit_milli is not None:
        return nominal + q.borrowing_limit_milli / MILLI_PER_GPU
    lendable = 0.0
    for other in cluster.partition_queues[q.partition]:
        o = cluster.queues[other]
        if other == queue or o.nominal_milli is None:
            continue
        cap = o.nominal_milli if o.lending_limit_milli is None else o.lending_limit_milli
        lendable += cap / MILLI_PER_GPU
    return nominal + lendable


def admissible_gang(cluster: Cluster, p: str) -> tuple[int, str]:
    """The largest whole-GPU gang partition ``p`` admits, and what bounds it: its own places
    plus what others lend it, or the most generous queue's quota."""
    own = slots(cluster, p)
    lent = sum(cap for _, _, cap in lent_in(cluster, p))
    by_capacity = own + lent
    limits = [quota_max(cluster, q) for q in cluster.partition_queues[p]]
    if limits and all(x is not None for x in limits):
        best = max(x for x in limits if x is not None)
        if best < by_capacity:
            return int(best), "queue quota (nominal + borrowing)"
    why = f"its {own} GPUs" + (f" + {lent} lent to it" if lent else "")
    return by_capacity, why


def nominal_total(cluster: Cluster, p: str) -> float:
    return sum(
        (cluster.queues[q].nominal_milli or 0) / MILLI_PER_GPU for q in cluster.partition_queues[p]
    )
