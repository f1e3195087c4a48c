"""Fence changes written as spec diffs: render a partition's GPUs back into selectors, grow a
fence by taking GPUs from donor partitions, carve a new partition out of an existing one.

Selectors are rendered in the spec's own syntax (``GROUP``, ``GROUP[i:j]``, ``GROUP[i]:a-b``), so
a diff line can be pasted into the cluster file. Growing follows ``gpufence size``'s habits: a
fence made of whole nodes grows by whole nodes, taken first from racks it already uses (the
fabric stays fenced); a fence of GPU ranges grows by GPUs, first on the nodes it already uses.
Donor queues' nominal quotas shrink with their partition (as ``sim.sizing.resize`` does), so
the changed spec still validates.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpufence.model.cluster import Cluster
from gpufence.model.job import MILLI_PER_GPU
from gpufence.model.partition import LendingRule
from gpufence.spec.errors import number_ranges

_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
Edit = tuple[str | None, str | None]  # (line as it is, line as it should be); None = no line
Edits = Mapping[str, list[Edit]]


def _item(text: str) -> str:
    return text if _PLAIN.match(text) else f'"{text}"'


def _runs(values: list[int]) -> list[tuple[int, int]]:
    """[0, 1, 2, 5] -> [(0, 3), (5, 6)] (half-open runs of consecutive values)."""
    out: list[tuple[int, int]] = []
    for v in sorted(values):
        if out and out[-1][1] == v:
            out[-1] = (out[-1][0], v + 1)
        else:
            out.append((v, v + 1))
    return out


def selectors(cluster: Cluster, gids: Iterable[int]) -> tuple[list[str], list[str]]:
    """(node selectors, GPU selectors) that select exactly ``gids``."""
    by_node: dict[int, list[int]] = {}
    for g in gids:
        gpu = cluster.gpus[g]
        by_node.setdefault(gpu.node, []).append(gpu.index)
    members: dict[str, list[int]] = {}
    for n in cluster.nodes:
        members.setdefault(n.group, []).append(n.idx)
    whole: dict[str, list[int]] = {}  # group -> positions of whole nodes
    gpu_sel: list[str] = []
    for node_idx in sorted(by_node):
        node = cluster.nodes[node_idx]
        pos = members[node.group].index(node_idx)
        local = sorted(by_node[node_idx])
        if len(local) == len(node.gpu_ids):
            whole.setdefault(node.group, []).append(pos)
            continue
        nsel = node.group if len(members[node.group]) == 1 else f"{node.group}[{pos}]"
        for a, b in _runs(local):
            gpu_sel.append(f"{nsel}:{a}" if b == a + 1 else f"{nsel}:{a}-{b - 1}")
    node_sel: list[str] = []
    for group, positions in whole.items():
        if len(positions) == len(members[group]):
            node_sel.append(group)
            continue
        for a, b in _runs(positions):
            node_sel.append(f"{group}[{a}]" if b == a + 1 else f"{group}[{a}:{b}]")
    return node_sel, gpu_sel


def selector_lines(cluster: Cluster, gids: Iterable[int]) -> list[str]:
    """``nodes: [...]`` and/or ``gpus: [...]`` lines for a partition holding ``gids``."""
    nodes, gpus = selectors(cluster, gids)
    out = []
    if nodes:
        out.append(f"nodes: [{', '.join(_item(s) for s in nodes)}]")
    if gpus:
        out.append(f"gpus: [{', '.join(_item(s) for s in gpus)}]")
    return out


def whole_nodes(cluster: Cluster, partition: str) -> bool:
    """Does the partition consist of whole nodes only?"""
    return all(
        len(cluster.node_partition_gpus[(partition, n)]) == len(cluster.nodes[n].gpu_ids)
        for n in cluster.partition_nodes[partition]
    )


@dataclass(frozen=True)
class FenceChange:
    """New GPU sets for some partitions, and the queue quotas that follow them."""

    gpus: Mapping[str, tuple[int, ...]]  # partition -> its GPUs after the change
    new_partitions: Mapping[str, str] = field(default_factory=dict)  # name -> its other fields
    quotas: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # queue -> old, new

    def size(self, partition: str) -> int:
        return len(self.gpus[partition])

    def diff(
        self, cluster: Cluster, queue_index: Mapping[str, int], edits: Edits | None = None
    ) -> str:
        """The change as a spec diff; ``edits`` adds other field changes of the partitions."""
        parts: dict[str, list[Edit]] = {p: list(v) for p, v in (edits or {}).items()}
        for p, after in self.gpus.items():
            before = (
                selector_lines(cluster, cluster.partition_gpus[p])
                if p in cluster.partitions
                else []
            )
            lines = selector_lines(cluster, after)
            pairs: list[Edit] = [(b, None) for b in before] + [(None, a) for a in lines]
            pairs += [(None, f) for f in self.new_partitions.get(p, "").splitlines()]
            parts.setdefault(p, []).extend(pairs)
        queues: dict[str, list[Edit]] = {
            q: [(f"nominal_gpus: {old:g}", f"nominal_gpus: {new:g}")]
            for q, (old, new) in self.quotas.items()
        }
        return spec_diff(cluster, parts, queues, queue_index)


def flow(items: Iterable[object]) -> str:
    """A YAML flow list: [a, "b[0:2]"]."""
    return "[" + ", ".join(_item(str(i)) for i in items) + "]"


def lending_line(rules: Iterable[LendingRule]) -> str:
    items = [
        f"{{to: {flow(r.to)}, cap_gpus: {r.cap_gpus}, reclaim_deadline_s: {r.reclaim_deadline_s:g}"
        + ("" if r.checkpointable_only else ", checkpointable_only: false")
        + "}"
        for r in rules
    ]
    return f"lending: [{', '.join(items)}]"


def spec_diff(
    cluster: Cluster,
    partitions: Edits,
    queues: Edits | None = None,
    queue_index: Mapping[str, int] | None = None,
) -> str:
    """A readable patch of the cluster file: ``-`` the line as it is, ``+`` as it should be,
    under the partition (or queue) it belongs to; a partition that does not exist yet is
    added whole."""
    lines: list[str] = []
    if partitions:
        lines.append("  partitions:")
    for p, edits in partitions.items():
        lines.append(f"    {p}:" if p in cluster.partitions else f"+   {p}:")
        for old, new in edits:
            if old is not None:
                lines.append(f"-     {old}")
            if new is not None:
                lines.append(f"+     {new}")
    index = queue_index or {}
    for q, edits in (queues or {}).items():
        pos = index.get(q)
        lines.append(f"  queues[{pos}]:   # {q}" if pos is not None else f"  queues ({q}):")
        for old, new in edits:
            if old is not None:
                lines.append(f"-   {old}")
            if new is not None:
                lines.append(f"+   {new}")
    return "\n".join(lines)


def _scaled_quotas(
    cluster: Cluster, partition: str, new_cap: int
) -> dict[str, tuple[float, float]]:
    old_cap = len(cluster.partition_gpus[partition])
    out: dict[str, tuple[float, float]] = {}
    for name in cluster.partition_queues[partition]:
        nominal = cluster.queues[name].nominal_milli
        if nominal is None or not old_cap or new_cap == old_cap:
            continue
        new = math.floor(nominal * new_cap / old_cap / MILLI_PER_GPU)
        out[name] = (nominal / MILLI_PER_GPU, float(new))
    return out


def grow(
    cluster: Cluster, partition: str, need_gpus: float, donors: Iterable[str]
) -> FenceChange | None:
    """``partition`` with at least ``need_gpus`` GPUs taken from ``donors`` (in that order of
    preference); None if they cannot give enough or ``partition`` already has enough."""
    have = list(cluster.partition_gpus[partition])
    missing = math.ceil(need_gpus) - len(have)
    if missing <= 0:
        return None
    fence_nodes = set(cluster.partition_nodes[partition])
    racks = {cluster.nodes[n].rack for n in fence_nodes}
    by_nodes = whole_nodes(cluster, partition)
    taken: dict[str, list[int]] = {}
    for donor in donors:
        if missing <= 0:
            break
        donor_nodes = sorted(
            cluster.partition_nodes[donor],
            key=lambda n: (n not in fence_nodes, cluster.nodes[n].rack not in racks, n),
        )
        for n in donor_nodes:
            if missing <= 0:
                break
            local = list(cluster.node_partition_gpus[(donor, n)])
            if by_nodes:
                if len(local) != len(cluster.nodes[n].gpu_ids):
                    continue  # a whole-node fence only takes whole nodes
                pick = local
            else:
                pick = local[:missing]
            taken.setdefault(donor, []).extend(pick)
            missing -= len(pick)
    if missing > 0:
        return None
    gained = [g for gs in taken.values() for g in gs]
    gpus: dict[str, tuple[int, ...]] = {partition: tuple(sorted(have + gained))}
    quotas: dict[str, tuple[float, float]] = {}
    for donor, gs in taken.items():
        left = tuple(g for g in cluster.partition_gpus[donor] if g not in set(gs))
        gpus[donor] = left
        quotas.update(_scaled_quotas(cluster, donor, len(left)))
    return FenceChange(gpus, quotas=quotas)


def carve(cluster: Cluster, partition: str, new: str, gpus: int, fields: str) -> FenceChange:
    """A new partition ``new`` of about ``gpus`` GPUs cut from the end of ``partition``: its last
    whole nodes when it has several, else its last GPUs."""
    have = list(cluster.partition_gpus[partition])
    nodes = cluster.partition_nodes[partition]
    if len(nodes) > 1:
        cut: list[int] = []
        for n in reversed(nodes):
            if len(cut) >= gpus:
                break
            cut = list(cluster.node_partition_gpus[(partition, n)]) + cut
        cut = (
            cut
            if len(cut) < len(have)
            else list(cluster.node_partition_gpus[(partition, nodes[-1])])
        )
    else:
        cut = have[-max(1, min(gpus, len(have) - 1)) :]
    keep = tuple(g for g in have if g not in set(cut))
    return FenceChange(
        {partition: keep, new: tuple(cut)},
        new_partitions={new: fields},
        quotas=_scaled_quotas(cluster, partition, len(keep)),
    )


def describe(cluster: Cluster, gids: Iterable[int]) -> str:
    """'local-0:0-3' style text for a sentence."""
    by_node: dict[int, list[int]] = {}
    for g in gids:
        by_node.setdefault(cluster.gpus[g].node, []).append(cluster.gpus[g].index)
    parts = [f"{cluster.nodes[n].name}:{number_ranges(sorted(v))}" for n, v in by_node.items()]
    return ", ".join(parts[:4]) + (f" and {len(parts) - 4} more nodes" if len(parts) > 4 else "")
