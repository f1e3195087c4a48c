"""Observed Nodes -> the cluster model the core schedules on.

The policy (partitions, queues) comes from the fence file (kube/fences.py); the hardware from
the Nodes: each GPU node's GPUs go to the partition whose ``node_selector`` its labels match.
What pods gpufence did not schedule already hold on a node (kube-scheduler's pods, DaemonSets)
is taken off its capacity, so it is never booked twice. Nodes are sorted by name, so the same
Nodes always give the same model (and the same decisions).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpufence.kube import names
from gpufence.kube.fences import FenceSpec
from gpufence.kube.objects import ObservedNode
from gpufence.model.cluster import Cluster
from gpufence.model.events import Event, NodeDown, NodeUp
from gpufence.model.hardware import Gpu, GpuType, Node
from gpufence.spec import CATALOGUE

_PRODUCT_TOKENS = re.compile(r"[A-Za-z]+\d+|\d+GB", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Usage:
    """What pods gpufence does not schedule request on one node."""

    gpus: int = 0
    cpu_milli: int = 0
    mem_mib: int = 0
    # GPU indices others' DRA claims hold on the node (kube/dra.py): left out of the model by
    # index, so the GPUs gpufence places on are the free devices, named by their own index
    devices: frozenset[int] = frozenset()

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.gpus + other.gpus,
            self.cpu_milli + other.cpu_milli,
            self.mem_mib + other.mem_mib,
            self.devices | other.devices,
        )


@dataclass(frozen=True)
class Hardware:
    """The model plus what the front end must tell the core or the operator about it."""

    cluster: Cluster
    failed: frozenset[str]  # nodes not Ready: their jobs are stopped (NodeDown)
    cordoned: frozenset[str]  # unschedulable or tainted: no new work (NodeDown, jobs keep running)
    problems: tuple[str, ...]  # nodes left out, and why (shown on /readyz and in the log)


# far above any real node (8 or 16 GPUs): a figure past it is a typo or a fake node
MAX_NODE_GPUS = 1024


def gpu_type_of(node: ObservedNode) -> GpuType:
    """The catalogue type whose name the feature-discovery product label spells
    ("NVIDIA-H100-80GB-HBM3" -> H100-80GB), else a type named after the product with the
    memory label's size (not MIG-capable: gpufence does not guess a MIG geometry)."""
    product = node.labels.get(names.NODE_GPU_PRODUCT, "")
    upper = product.upper()
    for name, gpu_type in CATALOGUE.items():
        model, _, memory = name.upper().partition("-")
        if model in upper and (memory in upper or memory.removesuffix("GB") + "G" in upper):
            return gpu_type
    mem_mib = node.labels.get(names.NODE_GPU_MEMORY, "")
    memory_gib = int(mem_mib) / 1024 if mem_mib.isdigit() and int(mem_mib) > 0 else 1.0
    return GpuType(product or "unknown-gpu", memory_gib)


def gpu_count(node: ObservedNode) -> int:
    """Whole GPUs, or with MIG's mixed strategy (where ``nvidia.com/gpu`` counts only the GPUs
    without MIG) the feature-discovery count."""
    if node.mig:
        count = node.labels.get(names.NODE_GPU_COUNT, "")
        return max(node.gpus, int(count) if count.isdigit() else 0)
    return node.gpus


def nvlink_domains(node: ObservedNode, gpus: int, label: str) -> tuple[tuple[int, ...], ...]:
    raw = node.labels.get(label, "")
    sizes = [int(s) for s in raw.split(".") if s.isdigit() and int(s) > 0] if raw else []
    if sum(sizes) != gpus:
        sizes = [gpus]  # no label, or one that no longer matches: one domain
    out, start = [], 0
    for size in sizes:
        out.append(tuple(range(start, start + size)))
        start += size
    return tuple(out)


def rack_of(node: ObservedNode, rack_label: str) -> str:
    return node.labels.get(rack_label) or node.labels.get(names.NODE_ZONE) or "rack-0"


def cordoned(node: ObservedNode, tolerated: Iterable[str]) -> bool:
    ok = set(tolerated)
    blocking = [t for t in node.taints if t.effect in ("NoSchedule", "NoExecute")]
    return node.unschedulable or any(t.key not in ok for t in blocking)


def _mig_mismatch(fences: FenceSpec, partition: str, obs: ObservedNode, gpus: int) -> list[str]:
    """The MIG instances the node offers (the GPU operator's MIG manager cut them) against the
    fence's layout: a difference means the kubelet would refuse pods gpufence places there."""
    mig = fences.policy.partitions[partition].mig
    if mig is None or mig.dynamic:
        return []
    want: dict[str, int] = {}
    for entry in mig.layout:
        profile = entry.split("@", 1)[0]
        want[profile] = want.get(profile, 0) + gpus
    if want == obs.mig:
        return []
    has = ", ".join(f"{p}={n}" for p, n in sorted(obs.mig.items())) or "none"
    need = ", ".join(f"{p}={n}" for p, n in sorted(want.items()))
    return [f"node {obs.name}: offers MIG instances {has}, fence {partition} lays out {need}"]


def build_hardware(
    fences: FenceSpec,
    nodes: Iterable[ObservedNode],
    foreign: Mapping[str, Usage] | None = None,
) -> Hardware:
    foreign = foreign or {}
    label = fences.names
    built: list[Node] = []
    gpus: list[Gpu] = []
    types: dict[str, GpuType] = dict(fences.policy.gpu_types)
    failed: set[str] = set()
    held: set[str] = set()
    problems: list[str] = []
    for obs in sorted(nodes, key=lambda n: n.name):
        count = gpu_count(obs)
        if count <= 0:
            continue  # not a GPU node
        if count > MAX_NODE_GPUS:  # (modelled GPU by GPU: 10^8 of them ran it out of memory)
            problems.append(
                f"node {obs.name}: reports {count} GPUs, more than a node holds (at most "
                f"{MAX_NODE_GPUS}): left out; check its {names.RES_GPU} allocatable and its "
                f"{names.NODE_GPU_COUNT} label"
            )
            continue
        partition, matches = fences.partition_of(obs.labels)
        if partition is None:
            why = (
                f"its labels match {', '.join(matches)}" if matches else "no node_selector matches"
            )
            problems.append(f"node {obs.name}: in no partition ({why})")
            continue
        used = foreign.get(obs.name, Usage())
        if used.devices:  # a DRA node: its free devices, each by its own index
            free = [k for k in range(count) if k not in used.devices]
            free = free[: max(0, len(free) - used.gpus)]
            whole = nvlink_domains(obs, count, label.nvlink_label)
            kept = (tuple(k for k in d if k in free) for d in whole)
            domains = tuple(d for d in kept if d)
        else:
            free = list(range(max(0, count - used.gpus)))
            domains = nvlink_domains(obs, len(free), label.nvlink_label)
        count = len(free)
        gpu_type = gpu_type_of(obs)
        types.setdefault(gpu_type.name, gpu_type)
        idx, gid0 = len(built), len(gpus)
        domain_of = {k: d for d, members in enumerate(domains) for k in members}
        built.append(
            Node(
                idx=idx,
                name=obs.name,
                group=partition,
                rack=rack_of(obs, label.rack_label),
                gpu_ids=tuple(range(gid0, gid0 + count)),
                gpu_type=gpu_type.name,
                cpu_milli=max(0, obs.cpu_milli - used.cpu_milli),
                mem_mib=max(0, obs.mem_mib - used.mem_mib),
                nvlink_domains=domains,
            )
        )
        gpus.extend(
            Gpu(gid0 + n, idx, k, gpu_type.name, domain_of[k], partition)
            for n, k in enumerate(free)
        )
        problems.extend(_mig_mismatch(fences, partition, obs, count))
        if not obs.ready:
            failed.add(obs.name)
        elif cordoned(obs, label.tolerated_taints):
            held.add(obs.name)
    cluster = replace(fences.policy, gpu_types=types, nodes=tuple(built), gpus=tuple(gpus))
    return Hardware(cluster, frozenset(failed), frozenset(held), tuple(problems))


def health_events(
    cluster: Cluster,
    nodes: Mapping[str, ObservedNode],
    tolerated: Iterable[str],
    down: dict[str, bool],
) -> list[Event]:
    """The model's nodes whose health changed since ``down`` (node -> True: failed, its jobs
    stop; False: cordoned, no new work) was last brought up to date, as the core's events;
    ``down`` is updated. A node the watch no longer shows counts as up: it is gone from the
    model at the next rebuild."""
    out: list[Event] = []
    for node in cluster.nodes:
        obs = nodes.get(node.name)
        want = (
            None if obs is None or (obs.ready and not cordoned(obs, tolerated)) else not obs.ready
        )
        if want == down.get(node.name):
            continue
        if want is None:
            out.append(NodeUp(node.name))
            down.pop(node.name, None)
        else:
            out.append(NodeDown(node.name, stop_jobs=want))
            down[node.name] = want
    return out
