"""From a scheduler assignment to what a process sees: ``CUDA_VISIBLE_DEVICES`` entries.

Whole GPUs, fractional shares and time-slices name the GPU's index on its node. A MIG instance
is named by its MIG device UUID: the real one (same GPU, profile and placement start) found by
discovery and kept current by the MIG manager as it creates and destroys instances
(``set_mig``, which also records the instance's capability devices, the nodes a job on it may
open), or, on fake GPUs, a stable made-up one. A fractional share on a GPU that runs an
MPS daemon (``set_mps``) names the GPU by its UUID, as MPS clients must, and carries its limits
(``share``). Assignments are stored as JSON so a restart can rebuild the exact same allocation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from gpufence.control.base.executor import GpuShare
from gpufence.control.gpus.devnodes import mig_nodes
from gpufence.control.gpus.discovery import Discovery, spec_gpu_type
from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Assignment
from gpufence.model.partition import SharingMode


class DeviceError(RuntimeError):
    pass


class DeviceMap:
    def __init__(self, cluster: Cluster, discovery: Discovery) -> None:
        self.cluster = cluster
        self.discovery = discovery
        # real MIG devices by (gpu index on the node, profile, start)
        self._mig = {
            (g.index, m.profile, m.start): m.uuid for g in discovery.gpus for m in g.mig_devices
        }
        self._mig_nodes = {
            (g.index, m.profile, m.start): m.device_nodes
            for g in discovery.gpus
            for m in g.mig_devices
        }
        self._gpu_nodes = {g.index: g.device_nodes for g in discovery.gpus}
        self._minor = {g.index: g.minor for g in discovery.gpus}
        self._uuid = {g.index: g.uuid for g in discovery.gpus}
        self._memory = {g.index: g.memory_mib for g in discovery.gpus}
        self._mps: dict[int, str] = {}  # global GPU id -> MPS pipe directory

    def set_mig(
        self,
        index: int,
        uuids: Mapping[tuple[str, int], str],
        ids: Mapping[tuple[str, int], tuple[int, int | None]] | None = None,
    ) -> None:
        """The MIG devices GPU ``index`` has now: (profile, start) -> MIG UUID, and with
        ``ids`` -> (GPU instance ID, compute instance ID), from which their capability devices
        are read (an instance the GPU no longer has loses its nodes; one created since gets
        its own)."""
        # built whole, then swapped in: the GPU sampler thread reads it (gpu_of)
        new = {k: v for k, v in self._mig.items() if k[0] != index}
        new.update({(index, p, s): u for (p, s), u in uuids.items()})
        self._mig = new
        minor = self._minor.get(index)
        if ids is None or minor is None:
            return  # no capability devices to name (fake GPUs, or NVML gave no minor number)
        nodes = {k: v for k, v in self._mig_nodes.items() if k[0] != index}
        for (p, s), (gi, ci) in ids.items():
            nodes[(index, p, s)] = mig_nodes(minor, gi, ci, self.discovery.caps)
        self._mig_nodes = nodes

    def set_mps(self, gid: int, pipe_dir: str | None) -> None:
        """GPU ``gid`` runs an MPS control daemon listening in ``pipe_dir`` (None: it does not)."""
        if pipe_dir is None:
            self._mps.pop(gid, None)
        else:
            self._mps[gid] = pipe_dir

    def share(self, a: Assignment) -> GpuShare | None:
        """The fractional share an assignment is (None for whole GPUs, MIG, time-slices). A
        share that asked for no GPU memory is limited to its fraction of the GPU's memory."""
        if a.mig_profile is not None or a.time_sliced or len(a.gpus) != 1:
            return None
        gpu = self.cluster.gpus[a.gpus[0]]
        part = self.cluster.partitions.get(gpu.partition or "")
        if part is None or part.sharing is not SharingMode.FRACTIONAL:
            return None
        mem = a.gpu_mem_mib or self._memory.get(gpu.index, 0) * a.milli // 1000
        return GpuShare(a.milli, mem, self._mps.get(gpu.gid))

    def gpu_of(self, device: str) -> int | None:
        """The GPU index (on this node) a CUDA_VISIBLE_DEVICES entry names, if known."""
        if device.isdigit():
            return int(device)
        for (index, _p, _s), uuid in list(self._mig.items()):
            if uuid == device:
                return index
        for index, uuid in self._uuid.items():
            if uuid == device:
                return index
        return None

    def devices(self, a: Assignment) -> tuple[str, ...]:
        cluster = self.cluster
        out: list[str] = []
        for gid in a.gpus:
            gpu = cluster.gpus[gid]
            if a.mig_profile is None:
                shared = gid in self._mps and self.share(a) is not None
                uuid = self._uuid.get(gpu.index) if shared else None
                out.append(uuid if uuid is not None else str(gpu.index))
                continue
            start = a.mig_start or 0
            if self.discovery.fake:
                node = cluster.nodes[gpu.node].name
                out.append(f"MIG-fake-{node}-gpu{gpu.index}-{a.mig_profile}@{start}")
                continue
            uuid = self._mig.get((gpu.index, a.mig_profile, start))
            if uuid is None:
                raise DeviceError(
                    f"GPU {gpu.index} has no MIG instance {a.mig_profile} at slot {start}; "
                    "the GPU's MIG layout differs from the cluster spec (nvidia-smi mig -lgi)"
                )
            out.append(uuid)
        return tuple(out)

    def nodes(self, a: Assignment) -> tuple[str, ...]:
        """The device nodes a job may open for ``a`` (containment denies the node's others):
        each GPU's ``/dev/nvidiaN``, plus a MIG instance's capability devices."""
        out: list[str] = []
        for gid in a.gpus:
            index = self.cluster.gpus[gid].index
            out += self._gpu_nodes.get(index, ())
            if a.mig_profile is not None:
                out += self._mig_nodes.get((index, a.mig_profile, a.mig_start or 0), ())
        return tuple(dict.fromkeys(out))


def assignment_json(a: Assignment) -> dict[str, Any]:
    return asdict(a)


def assignment_from_json(d: dict[str, Any]) -> Assignment:
    return Assignment(
        node=int(d["node"]),
        gpus=tuple(int(g) for g in d["gpus"]),
        milli=int(d.get("milli", 1000)),
        gpu_mem_mib=int(d.get("gpu_mem_mib", 0)),
        mig_profile=d.get("mig_profile"),
        mig_start=d.get("mig_start"),
        time_sliced=bool(d.get("time_sliced", False)),
    )


def check_machine(cluster: Cluster, discovery: Discovery) -> None:
    """The local executor runs everything on this machine: with real GPUs, the spec must
    describe this machine (one node, no more GPUs than found, same type)."""
    if discovery.fake:
        node_gpus = [len(n.gpu_ids) for n in cluster.nodes]
        if len(node_gpus) == 1 and node_gpus[0] > len(discovery.gpus):
            raise DeviceError(
                f"the cluster spec gives its node {node_gpus[0]} GPUs but --fake-gpus made "
                f"{len(discovery.gpus)}: give --fake-gpus {node_gpus[0]} (or describe "
                f"{len(discovery.gpus)} in the spec)"
            )
        return
    if len(cluster.nodes) != 1:
        raise DeviceError(
            f"the cluster spec has {len(cluster.nodes)} nodes but the local executor runs on "
            "this one machine: describe one node, or use --executor ray for several"
        )
    node = cluster.nodes[0]
    found = len(discovery.gpus)
    if len(node.gpu_ids) > found:
        raise DeviceError(
            f"node_groups: the spec gives {len(node.gpu_ids)} GPUs per node but this machine "
            f"has {found}; set gpus_per_node: {found}"
        )
    types = {spec_gpu_type(g) for g in discovery.gpus[: len(node.gpu_ids)]}
    if types != {node.gpu_type}:
        raise DeviceError(
            f"node_groups: gpu_type is {node.gpu_type} but this machine has "
            f"{', '.join(sorted(str(t) for t in types))}"
        )
