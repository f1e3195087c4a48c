"""The whole cluster model the scheduler works on: hardware + partitions + queues."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from gpufence.model.hardware import Fabric, Gpu, GpuType, Node
from gpufence.model.partition import Partition, QueueSpec


@dataclass(frozen=True)
class Cluster:
    """Immutable description of a cluster. GPUs and nodes are indexed by position."""

    name: str
    gpu_types: Mapping[str, GpuType]
    nodes: tuple[Node, ...]
    gpus: tuple[Gpu, ...]
    partitions: Mapping[str, Partition]
    queues: Mapping[str, QueueSpec]
    fabric: Fabric = field(default_factory=Fabric)

    @cached_property
    def racks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n.rack for n in self.nodes))

    @cached_property
    def partition_gpus(self) -> Mapping[str, tuple[int, ...]]:
        out: dict[str, list[int]] = {p: [] for p in self.partitions}
        for g in self.gpus:
            out[g.partition].append(g.gid)
        return {p: tuple(v) for p, v in out.items()}

    @cached_property
    def partition_nodes(self) -> Mapping[str, tuple[int, ...]]:
        """Nodes holding at least one GPU of each partition, in node order."""
        out: dict[str, dict[int, None]] = {p: {} for p in self.partitions}
        for g in self.gpus:
            out[g.partition][g.node] = None
        return {p: tuple(v) for p, v in out.items()}

    @cached_property
    def node_partition_gpus(self) -> Mapping[tuple[str, int], tuple[int, ...]]:
        """(partition, node) -> that node's GPUs in the partition, in local index order."""
        out: dict[tuple[str, int], list[int]] = {}
        for g in self.gpus:
            out.setdefault((g.partition, g.node), []).append(g.gid)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def partition_queues(self) -> Mapping[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {p: [] for p in self.partitions}
        for q in self.queues.values():
            out[q.partition].append(q.name)
        return {p: tuple(v) for p, v in out.items()}

    @cached_property
    def node_by_name(self) -> Mapping[str, int]:
        return {n.name: n.idx for n in self.nodes}

    def gpu_type_of(self, gid: int) -> GpuType:
        return self.gpu_types[self.gpus[gid].gpu_type]

    @cached_property
    def partition_mig_model(self) -> Mapping[str, str | None]:
        """Partition -> the MIG model of its first GPU (what a MIG job is charged by), None
        where it has no GPU or that GPU has no MIG."""
        gids = self.partition_gpus
        return {p: self.gpu_type_of(gids[p][0]).mig_model if gids[p] else None for p in gids}

    @cached_property
    def partition_gpu_types(self) -> Mapping[str, frozenset[str]]:
        out: dict[str, set[str]] = {p: set() for p in self.partitions}
        for g in self.gpus:
            out[g.partition].add(g.gpu_type)
        return {p: frozenset(v) for p, v in out.items()}

    @cached_property
    def partition_host_max(self) -> Mapping[str, tuple[int, int]]:
        """Partition -> (largest CPU milli, largest memory MiB) of its nodes."""
        return {
            p: (
                max((self.nodes[n].cpu_milli for n in nodes), default=0),
                max((self.nodes[n].mem_mib for n in nodes), default=0),
            )
            for p, nodes in self.partition_nodes.items()
        }

    @cached_property
    def _max_gpus_per_node(self) -> Mapping[str, int]:
        out: dict[str, int] = {p: 0 for p in self.partitions}
        for (p, _), v in self.node_partition_gpus.items():
            out[p] = max(out[p], len(v))
        return out

    def max_gpus_per_node(self, partition: str) -> int:
        return self._max_gpus_per_node.get(partition, 0)
