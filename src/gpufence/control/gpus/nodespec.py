"""A one-node cluster spec (the format of ``gpufence.spec``) from what discovery found.

``node_spec()`` describes this machine's discovered GPUs as a cluster-spec dict for one node,
which ``gpufence.spec.cluster_from_dict`` loads; ``spec_gpu_type()`` is the gpu_type it gives a
GPU (its catalogue type, else a declared custom one).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufence.control.gpus.records import DiscoveredGpu, Discovery, DiscoveryError
from gpufence.model.hardware import GpuType
from gpufence.model.job import WorkloadClass
from gpufence.spec.catalogue import CATALOGUE, mig_layout_problems
from gpufence.spec.errors import name_list, number_ranges
from gpufence.spec.schema import NAME_RE

__all__ = [
    "host_cpu_cores",
    "host_memory_gib",
    "host_resources",
    "node_spec",
    "nvlink_domain_sizes",
    "spec_gpu_type",
]


def _custom_type(gpu: DiscoveredGpu) -> GpuType:
    """A spec-declared type for a GPU outside the catalogue, named after its NVML name."""
    gib = round(gpu.memory_mib / 1024)
    base = re.sub(r"^(NVIDIA|Tesla)\s+", "", gpu.model.strip(), flags=re.IGNORECASE)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-._") or "GPU"
    if not re.search(r"\d+GB$", name, flags=re.IGNORECASE):
        name += f"-{gib}GB"
    if name in CATALOGUE:
        name = f"local-{name}"
    return GpuType(name, max(round(gpu.memory_mib / 1024, 1), 0.1))


def spec_gpu_type(gpu: DiscoveredGpu) -> str:
    """The gpu_type node_spec() gives this GPU: its catalogue type, else a declared custom one."""
    return gpu.gpu_type if gpu.gpu_type is not None else _custom_type(gpu).name


_MEMINFO = Path("/proc/meminfo")


def host_memory_gib(meminfo: Path = _MEMINFO) -> int | None:
    """Total host memory in whole GiB from /proc/meminfo, or None where it cannot be read."""
    try:
        text = meminfo.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, flags=re.MULTILINE)
    return max(1, int(m.group(1)) // (1 << 20)) if m else None


def host_cpu_cores() -> int | None:
    """CPU cores this process may run on (its affinity mask: what jobs started here can use,
    which may be fewer than the machine has), or None where it cannot be read."""
    try:
        return len(os.sched_getaffinity(0)) or None
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count()


def host_resources() -> dict[str, object]:
    """``cpu_cores`` and ``memory_gib`` of this machine for a node group (those known), so the
    core places ``--cpus`` / ``--mem`` requests against what is really here."""
    out: dict[str, object] = {}
    cores = host_cpu_cores()
    if cores:
        out["cpu_cores"] = cores
    memory = host_memory_gib()
    if memory:
        out["memory_gib"] = memory
    return out


def nvlink_domain_sizes(gpus: Sequence[DiscoveredGpu]) -> list[int]:
    """NVLink domain sizes for a node's nvlink_domains (consecutive GPU index runs).

    Unknown everywhere (no GPU reported NVLink state) gives one domain, the spec's default.
    Otherwise the connected components of the peer graph; the spec can only express runs of
    consecutive indices, so a component like {0, 2} is split into runs that each stay inside
    one component (never claiming a link that is not there).
    """
    n = len(gpus)
    if not any(g.nvlink_reported for g in gpus):
        return [n]
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for g in gpus:
        for p in g.nvlink_peers:
            if 0 <= p < n:
                parent[root(g.index)] = root(p)
    sizes: list[int] = []
    for i in range(n):
        if i > 0 and root(i) == root(i - 1):
            sizes[-1] += 1
        else:
            sizes.append(1)
    return sizes


def _node_type(gpus: Sequence[DiscoveredGpu]) -> tuple[str, GpuType | None]:
    """The one gpu_type of the node, and the declaration it needs if not in the catalogue."""
    by_type: dict[str, list[int]] = {}
    for g in gpus:
        by_type.setdefault(spec_gpu_type(g), []).append(g.index)
    if len(by_type) > 1:
        shown = "; ".join(f"GPU {number_ranges(ix)}: {t}" for t, ix in by_type.items())
        raise DiscoveryError(
            f"this machine has GPUs of different types ({shown}); a node group holds one GPU "
            "type, so describe this machine in a cluster file and pass it with --config FILE"
        )
    first = gpus[0]
    return spec_gpu_type(first), None if first.gpu_type is not None else _custom_type(first)


def _mig_layout(g: DiscoveredGpu, model: str | None) -> tuple[str, ...]:
    if model is None:
        raise DiscoveryError(
            f"GPU {g.index} ({g.model}) has MIG enabled, but gpufence has no MIG profiles for it "
            "(MIG-capable types: "
            f"{name_list(t.name for t in CATALOGUE.values() if t.mig_model)}); disable MIG "
            "(nvidia-smi -i N -mig 0) or describe the machine with --config FILE"
        )
    if not g.mig_devices:
        raise DiscoveryError(
            f"GPU {g.index} has MIG enabled but no MIG instances, so no job could use it: "
            "create instances (nvidia-smi mig -cgi ... -C), disable MIG, or describe the "
            "machine with --config FILE"
        )
    # Several compute instances of one GPU instance share its placement: list it once.
    seen: set[tuple[str, int]] = set()
    layout: list[str] = []
    for m in g.mig_devices:
        if m.start is None:
            layout.append(m.profile)
        elif (m.profile, m.start) not in seen:
            seen.add((m.profile, m.start))
            layout.append(f"{m.profile}@{m.start}")
    problems = mig_layout_problems(model, layout)
    if problems:
        raise DiscoveryError(
            f"GPU {g.index}: its MIG layout [{', '.join(layout)}] is not one gpufence knows "
            f"for {model}: {'; '.join(msg for _, msg in problems)}; describe the machine "
            "with --config FILE"
        )
    return tuple(layout)


def _partitions(gpus: Sequence[DiscoveredGpu], group: str, mig_model: str | None) -> dict[str, Any]:
    admits = [c.value for c in WorkloadClass]
    plain = [g.index for g in gpus if not g.mig_enabled]
    layouts: dict[tuple[str, ...], list[int]] = {}
    for g in gpus:
        if g.mig_enabled:
            layouts.setdefault(_mig_layout(g, mig_model), []).append(g.index)

    def selectors(indices: list[int]) -> list[str]:
        return [f"{group}:{r}" for r in number_ranges(indices).split(",")]

    out: dict[str, Any] = {}
    if plain:
        fence: dict[str, Any] = (
            {"nodes": [group]} if len(plain) == len(gpus) else {"gpus": selectors(plain)}
        )
        out["shared"] = {**fence, "admits": admits, "sharing": "exclusive", "backfill": True}
    for k, (layout, indices) in enumerate(layouts.items(), start=1):
        name = "mig" if len(layouts) == 1 else f"mig-{k}"
        out[name] = {
            "gpus": selectors(indices),
            "admits": admits,
            "sharing": "mig",
            "mig": {"layout": list(layout), "dynamic": False},
            "backfill": True,
        }
    return out


def node_spec(d: Discovery, node_name: str = "local") -> dict[str, Any]:
    """A cluster-spec dict for this one node: a node group of count 1 (node ``<name>-0``).

    Whole GPUs go into one exclusive partition ``shared`` admitting every class. GPUs that
    have MIG enabled cannot be handed out whole: they go into ``mig`` partitions (one per
    distinct layout: ``mig``, or ``mig-1``, ``mig-2``...) with the discovered instances as a
    fixed layout. cpu_cores and memory_gib are this host's.
    """
    if not re.fullmatch(NAME_RE, node_name):
        raise DiscoveryError(
            f"node name {node_name!r} is not usable in a cluster spec (letters, digits, '_', "
            "'.' and '-', starting with a letter or digit)"
        )
    gpus = sorted(d.gpus, key=lambda g: g.index)
    if not gpus:
        raise DiscoveryError(f"no GPUs to describe ({d.source})")
    if [g.index for g in gpus] != list(range(len(gpus))):
        raise DiscoveryError(
            f"GPU indices {[g.index for g in gpus]} are not 0..{len(gpus) - 1}; "
            "describe the machine with --config FILE"
        )
    type_name, declared = _node_type(gpus)
    mig_model = CATALOGUE[type_name].mig_model if declared is None else None
    group: dict[str, Any] = {
        "name": node_name,
        "count": 1,
        "gpus_per_node": len(gpus),
        "gpu_type": type_name,
        "nvlink_domains": nvlink_domain_sizes(gpus),
    }
    group.update(host_resources())
    spec: dict[str, Any] = {"name": node_name}
    if declared is not None:
        spec["gpu_types"] = [{"name": declared.name, "memory_gib": declared.memory_gib}]
    spec["node_groups"] = [group]
    spec["partitions"] = _partitions(gpus, node_name, mig_model)
    return spec
