"""The ``mig-parted`` configs the GPU operator's MIG manager applies, as gpufence names them.

The MIG manager re-cuts a node when its ``nvidia.com/mig.config`` label names a config of its
``mig-parted`` file (``version: v1``, ``mig-configs: {name: [{devices, mig-enabled,
mig-devices}]}``). A label is per node, so a config describes every GPU of the node: the GPU
being re-cut gets its new layout, the others keep theirs (``mig-parted`` leaves a GPU whose
instances already match alone). A config lists instance counts per GPU, not positions: the
MIG manager places them itself, and the device plugin advertises counts.

gpufence names a config by what it holds (``gpufence-<n>gpu-<hash>``), so the scheduler and the
file agree without a lookup; ``catalogue`` writes every config a dynamic fence can ask for on
nodes of one GPU model and size (``gpufence k8s mig-config``), and ``missing`` checks a given
file for them. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufence.model import mig as migmod

Counts = tuple[tuple[str, int], ...]  # one GPU's instances: (profile, how many), sorted

MAX_CONFIGS = 5000  # more is refused: a ConfigMap holds at most 1 MiB (``catalogue``)


class MigPartedError(ValueError):
    """A mig-parted file gpufence cannot read, or a catalogue too large to install."""


@dataclass(frozen=True, slots=True)
class ConfigWrite:
    """A config to write into the MIG manager's ConfigMap before a node is labelled with it
    (``kube/mig_configmap.py``), and the configs in use (every node's label, every re-cut in
    flight) that must stay there."""

    name: str
    items: tuple[Mapping[str, Any], ...]
    keep: frozenset[str]


def counts_of(layout: Iterable[str]) -> Counts:
    """``("1g.10gb@0", "3g.40gb@4", ...)`` -> ``(("1g.10gb", 1), ("3g.40gb", 1))``."""
    out: dict[str, int] = {}
    for entry in layout:
        profile = entry.rsplit("@", 1)[0]
        out[profile] = out.get(profile, 0) + 1
    return tuple(sorted(out.items()))


def config_name(gpus: Sequence[Counts]) -> str:
    """The label value that names this node layout (a label value: at most 63 characters)."""
    canonical = json.dumps([list(map(list, c)) for c in gpus], separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:12]
    return f"gpufence-{len(gpus)}gpu-{digest}"


def entries(gpus: Sequence[Counts]) -> list[dict[str, Any]]:
    """The config's ``mig-parted`` entries: GPUs with the same instances share one entry."""
    by_counts: dict[Counts, list[int]] = {}
    for index, counts in enumerate(gpus):
        by_counts.setdefault(counts, []).append(index)
    return [
        {
            "devices": devices,
            "mig-enabled": True,
            "mig-devices": dict(counts),
        }
        for counts, devices in sorted(by_counts.items(), key=lambda kv: kv[1][0])
    ]


def describe(counts: Counts) -> str:
    """``3g.40gb x1 + 1g.10gb x4``: largest first, as a pending reason shows it."""
    ranked = sorted(counts, key=lambda pc: (-_slices(pc[0]), pc[0]))
    return " + ".join(f"{p} x{n}" for p, n in ranked) or "no instances"


def _slices(profile: str) -> int:
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 0


def full_layouts(model: str) -> list[Counts]:
    """Every instance count a GPU of ``model`` can be cut into with no room left for another
    1g instance (the core's re-cuts fill what is left with 1g: ``sched/migcut.full_layout``);
    ``+me`` profiles left out. Sorted."""
    profiles = {n: p for n, p in migmod.profiles_for(model).items() if not p.media_ext}
    smallest = min(profiles, key=lambda n: (profiles[n].mem_slices, profiles[n].compute_slices))
    found: set[Counts] = set()

    def grow(layout: list[migmod.MigInstance], floor: int) -> None:
        if not migmod.feasible_starts(profiles, layout, smallest):
            found.add(counts_of(f"{i.profile}@{i.start}" for i in layout))
            return
        for name, p in profiles.items():
            for start in p.starts:
                if start >= floor and migmod.can_place(profiles, layout, name, start):
                    grow([*layout, migmod.MigInstance(name, start)], start)

    grow([], 0)
    return sorted(found)


def catalogue(model: str, gpus_per_node: Iterable[int]) -> dict[str, Any]:
    """The ``mig-parted`` file with every config gpufence may name on nodes of ``model`` with
    these GPU counts: each GPU any of the full layouts. Refused (naming the fix) where that
    is more than ``MAX_CONFIGS`` configs: the count is layouts ** GPUs per node."""
    layouts = full_layouts(model)
    configs: dict[str, Any] = {}
    for n in sorted(set(gpus_per_node)):
        if n < 1:
            raise MigPartedError(f"--gpus-per-node {n}: a node has at least 1 GPU")
        total = len(layouts) ** n
        if total + len(configs) > MAX_CONFIGS:
            raise MigPartedError(
                f"{model} nodes with {n} GPUs need {len(layouts)}**{n} = {total} configs (each "
                f"GPU any of {len(layouts)} full layouts), more than the {MAX_CONFIGS} a "
                "ConfigMap (1 MiB at most) can hold; give such nodes a static MIG layout "
                "(mig.dynamic: false) or generate for fewer GPUs per node"
            )
        for combo in itertools.product(layouts, repeat=n):
            configs[config_name(combo)] = entries(combo)
    return {"version": "v1", "mig-configs": configs}


def read_configs(data: object, source: str = "mig-parted config") -> dict[str, list[Any]]:
    """A ``mig-parted`` file's configs, checked as far as gpufence relies on them: errors name
    the config and field."""
    if not isinstance(data, Mapping) or data.get("version") != "v1":
        raise MigPartedError(f"{source}: expected a mapping with version: v1")
    configs = data.get("mig-configs")
    if not isinstance(configs, Mapping):
        raise MigPartedError(f"{source}: mig-configs must map config names to lists of entries")
    out: dict[str, list[Any]] = {}
    for name, items in configs.items():
        if not isinstance(items, list) or not all(isinstance(e, Mapping) for e in items):
            raise MigPartedError(f"{source}: mig-configs.{name} must be a list of entries")
        for k, e in enumerate(items):
            devices = e.get("devices")
            if devices != "all" and not (
                isinstance(devices, list) and all(isinstance(d, int) for d in devices)
            ):
                raise MigPartedError(
                    f"{source}: mig-configs.{name}[{k}].devices must be 'all' or GPU indices"
                )
            mig_devices = e.get("mig-devices") or {}
            if not isinstance(mig_devices, Mapping) or not all(
                isinstance(v, int) and v >= 0 for v in mig_devices.values()
            ):
                raise MigPartedError(
                    f"{source}: mig-configs.{name}[{k}].mig-devices must map profiles to counts"
                )
        out[str(name)] = list(items)
    return out


def node_counts(items: Sequence[Mapping[str, Any]], gpus: int) -> tuple[Counts, ...] | None:
    """What one config cuts each GPU of a ``gpus``-GPU node into (None: a GPU it leaves out or
    does not put in MIG mode)."""
    per: list[Counts | None] = [None] * gpus
    for e in items:
        devices = range(gpus) if e.get("devices") == "all" else e.get("devices", [])
        cuts = e.get("mig-devices") or {}  # (none where it turns MIG off)
        counts: Counts = tuple(sorted((str(p), int(n)) for p, n in cuts.items() if n))
        for d in devices:
            if 0 <= d < gpus:
                per[d] = counts if e.get("mig-enabled", False) else None
    if any(c is None for c in per):
        return None
    return tuple(c for c in per if c is not None)


def missing(
    configs: Mapping[str, Sequence[Mapping[str, Any]]], model: str, gpus_per_node: Iterable[int]
) -> list[str]:
    """The configs gpufence may name on such nodes that a given file lacks, or holds with other
    instances than its name says."""
    layouts = full_layouts(model)
    out: list[str] = []
    for n in sorted(set(gpus_per_node)):
        for combo in itertools.product(layouts, repeat=n):
            name = config_name(combo)
            items = configs.get(name)
            if items is None or node_counts(items, n) != combo:
                out.append(
                    f"{name} ({'; '.join(f'GPU {i}: {describe(c)}' for i, c in enumerate(combo))})"
                )
    return out
