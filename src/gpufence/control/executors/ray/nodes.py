"""Ray nodes as gpufence nodes: discovery for ``gpufence up --executor ray``.

``ray.nodes()`` lists the nodes of a Ray cluster with their resources and labels. ``parse()``
turns that list into ``RayNode`` records; ``cluster_spec()`` describes the alive GPU nodes as a
cluster-spec dict (the format of ``gpufence.spec``; ``nodespec.py`` does the same for one local
machine) and ``match_config()`` pairs the nodes of a ``--config`` spec with Ray nodes.

What a Ray node says about itself (set with ``ray start --resources '{...}'`` or ``--labels``):

* GPUs: the ``GPU`` resource (``ray start --num-gpus N``); nodes without GPUs are left out;
* GPU type: label ``gpufence_gpu_type=<TYPE>`` or resource ``gpufence_gpu_type:<TYPE>``, else
  ``H100-80GB``;
* rack: label ``rack=<name>`` or resource ``rack:<name>`` / ``gpufence_rack_<name>``, else
  ``rack-0``;
* name: label ``gpufence_node=<name>`` or resource ``gpufence_node:<name>``. With ``--config`` it
  names the spec node the Ray node is (e.g. ``a-0``); without, the node group is called
  ``<name>`` (node ``<name>-0``), else ``ray-<first 8 hex digits of the Ray node id>``.

Without ``--config`` every alive GPU node becomes one node group (count 1) and one exclusive
partition ``shared`` admits every class. This module imports ``ray`` only inside ``nodes_now``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufence.model.cluster import Cluster
from gpufence.model.job import WorkloadClass
from gpufence.spec.catalogue import CATALOGUE
from gpufence.spec.schema import NAME_RE

DEFAULT_GPU_TYPE = "H100-80GB"
DEFAULT_RACK = "rack-0"
NAME_KEY = "gpufence_node"
TYPE_KEY = "gpufence_gpu_type"


class RayNodesError(ValueError):
    """The Ray cluster cannot be described (or does not match the --config spec)."""


@dataclass(frozen=True, slots=True)
class RayNode:
    node_id: str
    ip: str
    alive: bool
    gpus: int
    gpu_type: str
    rack: str
    label: str | None
    """The ``gpufence_node`` name the node declares, if any."""
    cpus: int
    memory_gib: int


def _tagged(resources: Mapping[str, Any], labels: Mapping[str, Any], key: str) -> str | None:
    if labels.get(key):
        return str(labels[key])
    for name in resources:
        if name.startswith(key + ":") and len(name) > len(key) + 1:
            return name[len(key) + 1 :]
    return None


def _rack(resources: Mapping[str, Any], labels: Mapping[str, Any]) -> str:
    rack = _tagged(resources, labels, "rack")
    if rack is None:
        for name in resources:
            if name.startswith("gpufence_rack_") and len(name) > len("gpufence_rack_"):
                rack = name[len("gpufence_rack_") :]
                break
    return rack or DEFAULT_RACK


def parse(raw: Iterable[Mapping[str, Any]]) -> list[RayNode]:
    """``ray.nodes()`` entries as ``RayNode`` records (alive or not), sorted by node id."""
    out = []
    for n in raw:
        res: Mapping[str, Any] = n.get("Resources") or {}
        labels: Mapping[str, Any] = n.get("Labels") or {}
        out.append(
            RayNode(
                node_id=str(n["NodeID"]),
                ip=str(n.get("NodeManagerAddress") or "127.0.0.1"),
                alive=bool(n.get("Alive")),
                gpus=int(float(res.get("GPU", 0))),
                gpu_type=_tagged(res, labels, TYPE_KEY) or DEFAULT_GPU_TYPE,
                rack=_rack(res, labels),
                label=_tagged(res, labels, NAME_KEY),
                cpus=int(float(res.get("CPU", 0))),
                memory_gib=int(float(res.get("memory", 0)) // (1 << 30)),
            )
        )
    return sorted(out, key=lambda r: r.node_id)


def nodes_now() -> list[RayNode]:
    """The nodes of the Ray cluster this process is connected to (``ray.init`` done)."""
    import ray

    return parse(ray.nodes())


def group_name(node: RayNode) -> str:
    """The node group a Ray node becomes without --config (its node is ``<group>-0``)."""
    return node.label or f"ray-{node.node_id[:8]}"


def cluster_spec(nodes: Iterable[RayNode], name: str = "ray") -> dict[str, Any]:
    """A cluster-spec dict: one node group per alive Ray node with GPUs, one partition."""
    alive = [n for n in nodes if n.alive and n.gpus > 0]
    if not alive:
        raise RayNodesError(
            "the Ray cluster has no alive node with GPUs; start nodes with "
            "`ray start --num-gpus N` (fake GPUs are fine for trying it out)"
        )
    groups: list[dict[str, Any]] = []
    types: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n in alive:
        gname = group_name(n)
        if not re.fullmatch(NAME_RE, gname) or gname in seen:
            raise RayNodesError(
                f"Ray node {n.node_id}: {NAME_KEY} name {gname!r} is "
                + ("used by another node" if gname in seen else "not a valid gpufence name")
            )
        seen.add(gname)
        if not re.fullmatch(NAME_RE, n.rack):
            raise RayNodesError(f"Ray node {n.node_id}: rack {n.rack!r} is not a valid name")
        if n.gpu_type not in CATALOGUE and n.gpu_type not in {t["name"] for t in types}:
            raise RayNodesError(
                f"Ray node {n.node_id}: GPU type {n.gpu_type!r} is not a built-in type "
                f"(e.g. {', '.join(sorted(CATALOGUE)[:4])}, ...); describe the cluster with "
                "--config FILE to declare it"
            )
        group: dict[str, Any] = {
            "name": gname,
            "count": 1,
            "gpus_per_node": n.gpus,
            "gpu_type": n.gpu_type,
            "rack": n.rack,
        }
        if n.cpus > 0:
            group["cpu_cores"] = n.cpus
        if n.memory_gib > 0:
            group["memory_gib"] = n.memory_gib
        groups.append(group)
    admits = [c.value for c in WorkloadClass]
    return {
        "name": name,
        "node_groups": groups,
        "partitions": {
            "shared": {
                "nodes": [g["name"] for g in groups],
                "admits": admits,
                "sharing": "exclusive",
                "backfill": True,
            }
        },
    }


def auto_names(nodes: Iterable[RayNode]) -> dict[str, RayNode]:
    """gpufence node name -> Ray node, for a cluster built by ``cluster_spec``."""
    return {f"{group_name(n)}-0": n for n in nodes if n.alive and n.gpus > 0}


def match_config(cluster: Cluster, nodes: Iterable[RayNode]) -> dict[str, RayNode]:
    """gpufence node name -> Ray node for a ``--config`` spec: every spec node needs an alive
    Ray node declaring ``gpufence_node:<name>`` with at least the node's GPUs."""
    by_label: dict[str, RayNode] = {}
    for n in nodes:
        if n.alive and n.label is not None:
            if n.label in by_label:
                raise RayNodesError(
                    f"two alive Ray nodes declare {NAME_KEY} {n.label!r} "
                    f"({by_label[n.label].node_id[:8]}, {n.node_id[:8]})"
                )
            by_label[n.label] = n
    out: dict[str, RayNode] = {}
    missing: list[str] = []
    for node in cluster.nodes:
        ray_node = by_label.get(node.name)
        if ray_node is None:
            missing.append(node.name)
            continue
        if ray_node.gpus < len(node.gpu_ids):
            raise RayNodesError(
                f"node {node.name}: the spec gives it {len(node.gpu_ids)} GPUs but its Ray node "
                f"({ray_node.node_id[:8]}) has {ray_node.gpus} (ray start --num-gpus)"
            )
        out[node.name] = ray_node
    if missing:
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        shown = ", ".join(missing[:8]) + more
        raise RayNodesError(
            f"no alive Ray node for spec node(s) {shown}: start each node with "
            f"`ray start ... --resources '{{\"{NAME_KEY}:<name>\": 1}}'` "
            f"(or --labels {NAME_KEY}=<name>)"
        )
    return out
