"""Cluster policies to compare: the same hardware and workload under different fences.

A policy is a transformation of the scenario's (fenced) cluster plus an adapter for the jobs;
the scheduler core is the same for all of them.

  fenced             the scenario's partitions as written, with lending removed
  fenced-lend        the same, and every serving partition lends its idle GPUs to the partitions
                     admitting training (checkpointable work only), reclaimed on demand
  single-queue       one partition over every GPU, one fair-share queue per class, no priority
                     and no preemption: the anti-pattern the seed documents warn about
  preempt-on-demand  one partition over every GPU; serving keeps its priority and preempts
                     other work whenever it needs GPUs (no budget, no min runtime)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from gpufence.model.cluster import Cluster
from gpufence.model.job import GpuRequest, Job, RequestKind, WorkloadClass
from gpufence.model.partition import (
    LendingRule,
    Partition,
    PreemptionMode,
    PreemptionPolicy,
    QueueSpec,
    SharingMode,
)

SHARED = "shared"
POLICIES = ("single-queue", "preempt-on-demand", "fenced", "fenced-lend")


@dataclass(frozen=True)
class Policy:
    name: str
    cluster: Cluster
    adapt: Callable[[Job], Job]


def _identity(job: Job) -> Job:
    return job


def with_placement(base: Cluster, placement: str) -> Cluster:
    """The cluster with every fractional partition placing by ``placement`` (best-fit, fgd,
    fence-pack, random): the placement variants the simulator compares."""
    parts = {
        p: replace(part, placement=placement) if part.sharing is SharingMode.FRACTIONAL else part
        for p, part in base.partitions.items()
    }
    return replace(base, partitions=parts)


def build_policy(name: str, base: Cluster) -> Policy:
    if name == "fenced":
        parts = {p: replace(part, lending=()) for p, part in base.partitions.items()}
        return Policy(name, replace(base, partitions=parts), _identity)
    if name == "fenced-lend":
        return Policy(name, _with_lending(base), _identity)
    if name in ("single-queue", "preempt-on-demand"):
        return _merged(name, base)
    raise ValueError(f"unknown policy '{name}' (known: {', '.join(POLICIES)})")


def _with_lending(base: Cluster) -> Cluster:
    borrowers = tuple(
        p for p, part in base.partitions.items() if WorkloadClass.TRAINING in part.admits
    )
    parts: dict[str, Partition] = {}
    for p, part in base.partitions.items():
        if WorkloadClass.SERVING in part.admits and not part.lending and borrowers:
            cap = len(base.partition_gpus[p])
            part = replace(part, lending=(LendingRule(to=borrowers, cap_gpus=cap),))
        parts[p] = part
    return replace(base, partitions=parts)


def _merged(name: str, base: Cluster) -> Policy:
    on_demand = name == "preempt-on-demand"
    part = Partition(
        name=SHARED,
        admits=frozenset(WorkloadClass),
        sharing=SharingMode.EXCLUSIVE,
        backfill=True,
        preemption=PreemptionPolicy(
            mode=PreemptionMode.ON_DEMAND,
            from_partitions=(SHARED,),
            grace_s=120.0,
            min_runtime_s=0.0,  # (the anti-pattern as documented: no minimum runtime)
        )
        if on_demand
        else PreemptionPolicy(),
    )
    gpus = tuple(replace(g, partition=SHARED) for g in base.gpus)
    queues = {str(c): QueueSpec(name=str(c), partition=SHARED) for c in WorkloadClass}
    cluster = Cluster(
        name=f"{base.name}/{name}",
        gpu_types=base.gpu_types,
        nodes=base.nodes,
        gpus=gpus,
        partitions={SHARED: part},
        queues=queues,
        fabric=base.fabric,
    )

    def adapt(job: Job) -> Job:
        req = job.request
        if req.kind is not RequestKind.WHOLE:
            req = GpuRequest.whole(1)  # no MIG or fractional sharing without a fence for it
        prio = job.priority if on_demand else 0
        return replace(
            job, partition=SHARED, queue=str(job.workload_class), request=req, priority=prio
        )

    return Policy(name, cluster, adapt)
