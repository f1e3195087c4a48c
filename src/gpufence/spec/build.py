"""Schema -> Cluster: resolve names and selectors, and check every rule that spans items."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

from gpufence.model.cluster import Cluster
from gpufence.model.hardware import Fabric, Gpu, GpuType, Node
from gpufence.model.job import MILLI_PER_GPU
from gpufence.model.mig import MIG_CATALOGUE
from gpufence.model.partition import Partition, QueueSpec, SharingMode
from gpufence.spec.catalogue import declare_types, mig_layout_problems
from gpufence.spec.errors import (
    Path,
    SchemaParts,
    SpecError,
    SpecIssue,
    format_path,
    locate,
    name_list,
    number_ranges,
    suggest,
    validate_schema,
)
from gpufence.spec.schema import (
    MigSchema,
    NodeGroupSchema,
    NodeSelector,
    PartitionFence,
    PartitionSchema,
)

_MAX_NODE_LINES = 8  # per-node "belongs to no partition" lines before summarising the rest


class _Builder:
    def __init__(self, parts: SchemaParts, issues: list[SpecIssue]) -> None:
        self.parts = parts
        self.issues = issues
        self.types: dict[str, GpuType] = {}
        self.groups: dict[str, tuple[NodeGroupSchema, list[int]]] = {}
        self.nodes: list[Node] = []
        self.owner: list[tuple[str, Path] | None] = []  # by gid: (partition, selector path)
        self.gpu_node: list[int] = []  # by gid: node index
        self.held: dict[str, list[int]] = {}  # partition -> the gids it claimed
        self.selection_ok: dict[str, bool] = {}  # False: its GPU count is not to be trusted
        self.partition_names = [n for n, _ in parts.partitions]
        self.partition_names += sorted(n for n in parts.broken.get("fences", ()) if n)

    def err(self, path: Path, message: str, anchor: Path | None = None) -> None:
        self.issues.append(SpecIssue(path, message, anchor=anchor))

    def unknown(self, path: Path, what: str, name: str, known: list[str]) -> None:
        hint = suggest(name, known)
        self.err(path, f"{what} {name!r} does not exist (known: {name_list(known)}){hint}")

    # -- hardware ---------------------------------------------------------------------------

    def build_nodes(self) -> None:
        first_pos: dict[str, int] = {}
        for i, g in self.parts.groups:
            path: Path = ("node_groups", i)
            if g.name in first_pos:
                where = f"node_groups[{first_pos[g.name]}]"
                self.err((*path, "name"), f"duplicate group {g.name!r} (first declared at {where})")
                continue
            first_pos[g.name] = i
            if g.gpu_type not in self.types and not self.parts.is_broken("gpu_types", g.gpu_type):
                known = list(self.types)
                msg = f"{g.gpu_type!r} is not a known GPU type (known: {name_list(known)}; "
                msg += "or declare it under gpu_types)"
                self.err((*path, "gpu_type"), msg + suggest(g.gpu_type, known))
            sizes = g.nvlink_domains or (g.gpus_per_node,)
            if sum(sizes) != g.gpus_per_node:
                msg = f"{list(sizes)} sums to {sum(sizes)} but gpus_per_node is {g.gpus_per_node} "
                self.err((*path, "nvlink_domains"), msg + "(sizes must add up to a node's GPUs)")
                sizes = (g.gpus_per_node,)
            bounds = [sum(sizes[:d]) for d in range(len(sizes) + 1)]
            domains = tuple(tuple(range(a, b)) for a, b in itertools.pairwise(bounds))
            width = len(str(g.count - 1))
            members: list[int] = []
            for k in range(g.count):
                idx, gid0 = len(self.nodes), len(self.owner)
                members.append(idx)
                self.owner.extend([None] * g.gpus_per_node)
                self.gpu_node.extend([idx] * g.gpus_per_node)
                self.nodes.append(
                    Node(
                        idx=idx,
                        name=f"{g.name}-{k:0{width}d}",
                        group=g.name,
                        rack=g.rack,
                        gpu_ids=tuple(range(gid0, gid0 + g.gpus_per_node)),
                        gpu_type=g.gpu_type,
                        cpu_milli=g.cpu_cores * 1000,
                        mem_mib=g.memory_gib * 1024,
                        nvlink_domains=domains,
                    )
                )
            self.groups[g.name] = (g, members)

    # -- fences -----------------------------------------------------------------------------

    def resolve(self, path: Path, sel: NodeSelector) -> list[int] | None:
        found = self.groups.get(sel.group)
        if found is None:
            if not self.parts.is_broken("node_groups", sel.group):
                self.unknown(path, "group", sel.group, list(self.groups))
            return None
        spec, members = found
        try:
            return [members[k] for k in sel.resolve(spec.count)]
        except ValueError as exc:
            self.err(path, f"{str(sel)!r}: {exc}")
            return None

    def claim(self, pname: str, path: Path, picks: Iterable[tuple[int, int]]) -> bool:
        """Give (node, local GPU) pairs to ``pname``; report those another selector holds."""
        conflicts: dict[tuple[str, Path], dict[int, list[int]]] = {}
        for node, local in picks:
            gid = self.nodes[node].gpu_ids[local]
            owner = self.owner[gid]
            if owner is None:
                self.owner[gid] = (pname, path)
                self.held[pname].append(gid)
            else:
                conflicts.setdefault(owner, {}).setdefault(node, []).append(local)
        for (other, other_path), by_node in conflicts.items():
            shown = [f"{self.nodes[n].name}:{number_ranges(ks)}" for n, ks in by_node.items()]
            count = sum(len(ks) for ks in by_node.values())
            more = f" and {len(shown) - 3} more nodes" if len(shown) > 3 else ""
            what = f"GPU{'s' if count > 1 else ''} {', '.join(shown[:3])}{more}"
            self.err(
                path,
                f"{what} {'are' if count > 1 else 'is'} already in partition {other!r} "
                f"(selected by {format_path(other_path)}); a GPU belongs to one partition only",
            )
        return not conflicts

    def select(self, pname: str, p: PartitionFence) -> None:
        self.held[pname] = []
        ok = True
        for j, nsel in enumerate(p.nodes):
            path: Path = ("partitions", pname, "nodes", j)
            picked = self.resolve(path, nsel)
            if picked is None:
                ok = False
                continue
            pairs = [(n, k) for n in picked for k in range(len(self.nodes[n].gpu_ids))]
            ok = self.claim(pname, path, pairs) and ok
        for j, gsel in enumerate(p.gpus):
            path = ("partitions", pname, "gpus", j)
            picked = self.resolve(path, gsel.nodes)
            per_node = self.groups[gsel.nodes.group][0].gpus_per_node if picked else 0
            if picked is not None and gsel.last >= per_node:
                msg = f"{str(gsel)!r}: GPU index {gsel.last} is out of range (nodes of group "
                msg += f"{gsel.nodes.group!r} have {per_node} GPUs: 0-{per_node - 1})"
                self.err(path, msg)
                picked = None
            if picked is None:
                ok = False
                continue
            pairs = [(n, k) for n in picked for k in range(gsel.first, gsel.last + 1)]
            ok = self.claim(pname, path, pairs) and ok
        self.selection_ok[pname] = ok

    def report_unfenced(self) -> None:
        if self.parts.broken.get("fences"):
            return  # a partition whose selectors failed the schema may have claimed these GPUs
        unfenced: list[tuple[Node, list[int]]] = []
        for node in self.nodes:
            free = [k for k, gid in enumerate(node.gpu_ids) if self.owner[gid] is None]
            if free:
                unfenced.append((node, free))
        group_pos = {g.name: i for i, g in self.parts.groups}
        for node, free in unfenced[:_MAX_NODE_LINES]:
            gpus = f"GPUs {number_ranges(free)}" if len(free) > 1 else f"GPU {free[0]}"
            verb = "belong" if len(free) > 1 else "belongs"
            msg = f"node {node.name} {gpus} {verb} to no partition "
            msg += "(add them to a partition's nodes or gpus)"
            self.err((), msg, anchor=("node_groups", group_pos[node.group]))
        rest = unfenced[_MAX_NODE_LINES:]
        if rest:
            n_gpus = sum(len(free) for _, free in rest)
            span = f"{rest[0][0].name} .. {rest[-1][0].name}"
            self.err((), f"... and {len(rest)} more nodes ({span}, {n_gpus} GPUs) in no partition")

    # -- partition policies -----------------------------------------------------------------

    def check_partition(self, pname: str, p: PartitionSchema) -> None:
        base: Path = ("partitions", pname)
        for rel, message in p.local_problems():
            self.err((*base, *rel), message)
        held = len(self.held[pname])
        if held == 0 and self.selection_ok[pname]:
            self.err(base, "selects no GPUs (add node selectors to nodes or GPU selectors to gpus)")
        if p.sharing is SharingMode.MIG:
            self.check_mig(pname, p.mig or MigSchema())
        for k, rule in enumerate(p.lending):
            for t, target in enumerate(rule.to):
                self.check_ref((*base, "lending", k, "to", t), target, pname, "lend to")
            if self.selection_ok[pname] and rule.cap_gpus > held:
                msg = f"{rule.cap_gpus} is more than the {held} GPUs partition {pname!r} holds"
                self.err((*base, "lending", k, "cap_gpus"), msg)
        if p.preemption is not None:
            for k, source in enumerate(p.preemption.from_):
                self.check_ref((*base, "preemption", "from", k), source, pname, "preempt from")

    def check_ref(self, path: Path, target: str, pname: str, verb: str) -> None:
        if target == pname:
            self.err(path, f"partition {pname!r} cannot {verb} itself")
        elif target not in self.partition_names:
            self.unknown(path, "partition", target, self.partition_names)

    def check_mig(self, pname: str, mig: MigSchema) -> None:
        base: Path = ("partitions", pname)
        held_types = dict.fromkeys(self.nodes[self.gpu_node[g]].gpu_type for g in self.held[pname])
        capable = [n for n, t in self.types.items() if t.mig_model]
        models: dict[str, None] = {}
        for tname in held_types:
            gpu_type = self.types.get(tname)
            if gpu_type is None:
                continue  # unknown type: reported at its node group
            if gpu_type.mig_model is None:
                msg = f"'mig' needs MIG-capable GPUs, but the partition holds {tname} GPUs "
                self.err((*base, "sharing"), msg + f"(MIG-capable: {name_list(capable)})")
            elif gpu_type.mig_model in MIG_CATALOGUE:  # a bad mig_model is reported at its type
                models[gpu_type.mig_model] = None
        for model in models:
            for k, message in mig_layout_problems(model, mig.layout):
                where: Path = (*base, "mig", "layout") + (() if k is None else (k,))
                self.err(where, message)

    # -- queues and assembly ----------------------------------------------------------------

    def build_queues(self) -> dict[str, QueueSpec]:
        first: dict[str, int] = {}
        declared: dict[str, list[QueueSpec]] = {n: [] for n, _ in self.parts.partitions}
        nominal: dict[str, tuple[float, int]] = {}  # partition -> (sum, last queue index)
        for i, q in self.parts.queues:
            path: Path = ("queues", i)
            for rel, message in q.local_problems():
                self.err((*path, *rel), message)
            if q.name in first:
                where = f"queues[{first[q.name]}]"
                self.err((*path, "name"), f"duplicate queue {q.name!r} (first declared at {where})")
                continue
            first[q.name] = i
            if q.partition not in declared:
                if q.partition not in self.partition_names:
                    known = self.partition_names
                    self.unknown((*path, "partition"), "partition", q.partition, known)
                continue
            if q.nominal_gpus is not None:
                total, _ = nominal.get(q.partition, (0.0, i))
                nominal[q.partition] = (total + q.nominal_gpus, i)
            declared[q.partition].append(q.to_model())
        for pname, (total, last) in nominal.items():
            held = len(self.held[pname])
            # Compare in milli-GPU, the unit quotas are kept in, so 0.1 + 0.2 never trips it.
            if self.selection_ok[pname] and round(total * MILLI_PER_GPU) > held * MILLI_PER_GPU:
                msg = f"queues of partition {pname!r} declare {total:g} GPUs of nominal quota "
                self.err(("queues", last, "nominal_gpus"), msg + f"but it holds {held}")
        queues: dict[str, QueueSpec] = {}
        for pname, specs in declared.items():
            if not specs and pname in first:
                msg = f"{pname!r} is also the name of the default queue of partition {pname!r} "
                msg += f"(it declares none): rename this queue or declare a queue for {pname!r}"
                self.err(("queues", first[pname], "name"), msg)
                continue
            # (a partition declaring no queue has one nobody owns: every tenant's job naming
            # no queue may go there)
            specs = specs or [QueueSpec(name=pname, partition=pname)]
            queues.update((s.name, s) for s in specs)
        return queues

    def build(self) -> Cluster | None:
        self.types, type_issues = declare_types(self.parts.gpu_types)
        self.issues.extend(type_issues)
        self.build_nodes()
        for pname, p in self.parts.partitions:
            self.select(pname, p)
        self.report_unfenced()
        partitions: dict[str, Partition] = {}
        for pname, p in self.parts.partitions:
            if isinstance(p, PartitionSchema):  # else its policy fields failed the schema
                self.check_partition(pname, p)
                partitions[pname] = p.to_model(pname)
        queues = self.build_queues()
        if self.issues:
            return None
        gpus: list[Gpu] = []
        for node in self.nodes:
            domain_of = {k: d for d, members in enumerate(node.nvlink_domains) for k in members}
            for k, gid in enumerate(node.gpu_ids):
                owner = self.owner[gid]
                assert owner is not None  # report_unfenced would have made an issue
                gpus.append(Gpu(gid, node.idx, k, node.gpu_type, domain_of[k], owner[0]))
        # Keep the types the nodes use plus every declared one, in catalogue-then-declared order.
        used = {n.gpu_type for n in self.nodes} | {t.name for _, t in self.parts.gpu_types}
        fabric = self.parts.fabric
        return Cluster(
            name=self.parts.name,
            gpu_types={n: t for n, t in self.types.items() if n in used},
            nodes=tuple(self.nodes),
            gpus=tuple(gpus),
            partitions=partitions,
            queues=queues,
            fabric=Fabric(fabric.node_uplink_gbps, fabric.rack_uplink_gbps),
        )


def cluster_from_dict(
    data: object, *, source: str | None = None, lines: Mapping[Path, int] | None = None
) -> Cluster:
    """Validate a parsed cluster spec and build the Cluster; SpecError lists every problem.

    ``source`` names the file in messages; ``lines`` maps field paths to 1-based source lines
    (the YAML loader provides it) so that each problem can point at its line.
    """
    if not isinstance(data, Mapping):
        got = "an empty document" if data is None else f"a {type(data).__name__}"
        msg = f"a cluster spec must be a mapping with name, node_groups and partitions; got {got}"
        raise SpecError([msg], source)
    parts, issues = validate_schema(data)
    cluster = _Builder(parts, issues).build()
    if cluster is None:
        raise SpecError(locate(issues, lines or {}), source)
    return cluster
