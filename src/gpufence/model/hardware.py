"""Hardware model: GPU types, GPUs, nodes, racks and the fabric between them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str  # e.g. "H100-80GB"
    memory_gib: float
    mig_model: str | None = None  # key into the MIG catalogue, None if not MIG-capable
    nvlink_gbps: float = 0.0  # per-GPU NVLink bandwidth (0 = PCIe only)

    @property
    def memory_mib(self) -> int:
        return int(self.memory_gib * 1024)


@dataclass(frozen=True, slots=True)
class Gpu:
    gid: int  # cluster-wide index
    node: int  # index of its node
    index: int  # index on the node (what CUDA_VISIBLE_DEVICES names)
    gpu_type: str
    nvlink_domain: int  # index of its NVLink domain on the node
    partition: str


@dataclass(frozen=True, slots=True)
class Node:
    idx: int
    name: str
    group: str
    rack: str
    gpu_ids: tuple[int, ...]  # global GPU ids, in local index order
    gpu_type: str
    cpu_milli: int
    mem_mib: int
    nvlink_domains: tuple[tuple[int, ...], ...]  # local GPU indices per NVLink domain


@dataclass(frozen=True, slots=True)
class Fabric:
    node_uplink_gbps: float = 200.0
    rack_uplink_gbps: float = 1600.0
