"""Spec rules about the fences themselves: what shares the serving partition, whether it is big
enough to survive a node failure at peak, and whether the cluster is the wrong shape for a
contractual SLO. Pure functions: ``(cluster, inputs) -> list[Advice]``.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufence.advice import catalog as rules
from gpufence.advice import seeds
from gpufence.advice.fence_resize import Edit, carve, flow, grow, lending_line, spec_diff
from gpufence.advice.inputs import LintInputs
from gpufence.advice.record import Advice, Severity, gpus, pct
from gpufence.advice.shape import admissible_gang, admitting, node_gpus, racks_of
from gpufence.advice.shape import serving_partitions as servings
from gpufence.model.cluster import Cluster
from gpufence.model.job import WorkloadClass
from gpufence.model.partition import SharingMode

S, T, NB, B = (  # NB: notebooks (interactive)
    WorkloadClass.SERVING,
    WorkloadClass.TRAINING,
    WorkloadClass.INTERACTIVE,
    WorkloadClass.BATCH,
)
_ORDER = list(WorkloadClass)
_RECLAIM = "reclaim: {idle_threshold: 0.05, idle_after_s: 1800, warning_s: 300}"


def _classes(cs: Iterable[WorkloadClass]) -> list[WorkloadClass]:
    return sorted(cs, key=_ORDER.index)


def _admits(cs: list[WorkloadClass]) -> str:
    return f"admits: {flow(cs)}"


def _free_name(cluster: Cluster, want: str) -> str:
    name, k = want, 2
    while name in cluster.partitions:
        name, k = f"{want}-{k}", k + 1
    return name


def donors(cluster: Cluster, p: str) -> list[str]:
    """Partitions a serving fence would take GPUs from, most natural first: the ones it preempts
    or lends to, then training, batch and any other non-serving partition."""
    part = cluster.partitions[p]
    order = [*part.preemption.from_partitions, *(t for r in part.lending for t in r.to)]
    order += admitting(cluster, T) + admitting(cluster, B) + list(cluster.partitions)
    serving = set(servings(cluster))
    return [d for d in dict.fromkeys(order) if d != p and d not in serving]


def serving_shares_partition(cluster: Cluster, inp: LintInputs) -> list[Advice]:
    out: list[Advice] = []
    for p in servings(cluster):
        part = cluster.partitions[p]
        others = _classes(part.admits - {S})
        if not others or part.sharing is SharingMode.MIG:  # MIG: mig-not-a-fence says it
            continue
        reasons = []
        if NB in others:
            reasons += [seeds.quote(seeds.NOTEBOOKS), seeds.quote(seeds.THIRD_PARTITION)]
        if B in others:
            reasons.append(seeds.quote(seeds.EVAL))
        if T in others:
            reasons.append(seeds.quote(seeds.SPLIT_FIRST))
        names = ", ".join(others)
        who = {NB: "a notebook", B: "an eval run", T: "a training gang"}
        holders = " or ".join(who[c] for c in others if c in who)
        why = (
            f"Partition {p} admits serving together with {names}: they queue for the same "
            f"{gpus(len(cluster.partition_gpus[p]))}, so {holders} can hold capacity that "
            "serving needs at its peak, and nothing fences it off. " + " ".join(reasons)
        )
        homes = {c: admitting(cluster, c, exclude=p) for c in others}
        moved = [f"{c} -> {', '.join(ps)}" for c, ps in homes.items() if ps]
        missing = [c for c, ps in homes.items() if not ps]
        fix = f"Admit only serving in {p} (admits: [serving])"
        fix += f"; the other classes already have partitions ({'; '.join(moved)})" if moved else ""
        edits: dict[str, list[Edit]] = {p: [(_admits(_classes(part.admits)), _admits([S]))]}
        diff = spec_diff(cluster, edits)
        n = len(cluster.partition_gpus[p])
        if missing and n >= 2:
            new = _free_name(cluster, str(NB) if NB in missing else str(missing[0]))
            fields = [_admits(missing), "sharing: exclusive"] + (
                [_RECLAIM] if NB in missing else []
            )
            change = carve(cluster, p, new, max(1, n // 4), "\n".join(fields))
            fix += (
                f"; give {', '.join(missing)} a partition of its own, e.g. {new} on "
                f"{gpus(change.size(new))} taken from {p}"
                + (" with idle reclaim" if NB in missing else "")
            )
            diff = change.diff(cluster, inp.queue_index, edits)
        elif missing:
            fix += f"; give {', '.join(missing)} a partition of its own on other GPUs"
        summary = f"{p} admits serving and {names}"
        out.append(
            Advice(
                rules.SERVING_SHARES_PARTITION,
                Severity.WARNING,
                ("partitions", p, "admits"),
                why,
                {"summary": summary, "partition": p, "shares_with": [str(c) for c in others]},
                fix + ".",
                diff,
            )
        )
    return out


def mig_not_a_fence(cluster: Cluster, inp: LintInputs) -> list[Advice]:
    out: list[Advice] = []
    for p in servings(cluster):
        part = cluster.partitions[p]
        others = _classes(part.admits - {S})
        if part.sharing is not SharingMode.MIG or not others:
            continue
        names = ", ".join(others)
        why = (
            f"Partition {p} puts serving and {names} on the same GPUs, separated only by MIG "
            "slices: each instance has its own SMs and memory, but the node's NIC, PCIe and "
            "storage path are shared, and MIG capacity fragments. " + seeds.quote(seeds.MIG)
        )
        n = len(cluster.partition_gpus[p])
        edits: dict[str, list[Edit]] = {p: [(_admits(_classes(part.admits)), _admits(others))]}
        fix = f"Take serving out of {p} (keep MIG for {names})"
        diff = spec_diff(cluster, edits)
        if n >= 2:
            new = _free_name(cluster, "serving" if p != "serving" else "serving-whole")
            change = carve(cluster, p, new, max(1, n // 2), f"{_admits([S])}\nsharing: exclusive")
            fix += f" and give it whole GPUs of its own, e.g. {new} on {gpus(change.size(new))}"
            diff = change.diff(cluster, inp.queue_index, edits)
        else:
            fix += " and give it whole GPUs of its own (an exclusive partition admitting serving)"
        out.append(
            Advice(
                rules.MIG_NOT_A_FENCE,
                Severity.WARNING,
                ("partitions", p, "sharing"),
                why,
                {"summary": f"{p} separates serving from {names} by MIG only", "partition": p},
                fix + ".",
                diff,
            )
        )
    return out


def serving_no_failure_margin(cluster: Cluster, inp: LintInputs) -> list[Advice]:
    out: list[Advice] = []
    for p in servings(cluster):
        peak = inp.peak(p)
        if peak is None:
            continue
        have = len(cluster.partition_gpus[p])
        per_node = node_gpus(cluster, p)
        single = len(cluster.nodes) == 1  # no other node to hold a margin
        margin = 0 if single else inp.failure_margin_nodes * per_node
        need = peak.gpus + margin
        if have >= need:
            continue
        margin_text = (
            "this cluster is one node, so a node failure takes everything and no margin helps"
            if single
            else f"a margin of {inp.failure_margin_nodes} node ({gpus(per_node)}) on top"
        )
        why = (
            f"Serving wants {gpus(peak.gpus)} at its peak ({peak.source}); with {margin_text}, "
            f"partition {p} needs {gpus(need)} but holds {have}. At the peak, or with a node "
            "down, serving runs out of its own GPUs and can only wait or preempt. "
            + seeds.quote(seeds.RESERVE)
            + " "
            + seeds.quote(seeds.HOPE)
        )
        change = grow(cluster, p, need, donors(cluster, p))
        evidence = {
            "summary": f"{p} holds {have} GPUs; peak {peak.gpus:g} + margin {margin} = {need:g}",
            "partition": p,
            "gpus": have,
            "peak_gpus": peak.gpus,
            "margin_gpus": margin,
            "needed_gpus": need,
            "peak_source": peak.source,
        }
        if change is None:
            fix = f"Add GPUs to {p}: it needs {gpus(need)} (the other partitions cannot give them)"
            diff = ""
        else:
            size = change.size(p)
            gave = [
                f"{len(cluster.partition_gpus[d]) - len(g)} from {d}"
                for d, g in change.gpus.items()
                if d != p
            ]
            fix = f"Grow {p} to {gpus(size)} (taking {', '.join(gave)})"
            diff = change.diff(cluster, inp.queue_index)
            evidence = {**evidence, "recommended_gpus": size}
        out.append(
            Advice(
                rules.SERVING_NO_FAILURE_MARGIN,
                Severity.WARNING,
                ("partitions", p),
                why,
                evidence,
                fix + ".",
                diff,
            )
        )
    return out


LARGE_GANG_FRACTION = 0.5  # "a large fraction of the farm"


def wrong_shape(cluster: Cluster, inp: LintInputs) -> list[Advice]:
    out: list[Advice] = []
    farm = len(cluster.gpus)
    for s in servings(cluster):
        slo = inp.slo(cluster, s)
        training = admitting(cluster, T, exclude=s)
        if slo is None or not slo.contractual or not training or not farm:
            continue
        seen = [g for t in training if (g := inp.gang(t)) is not None]
        if seen:
            top = max(seen, key=lambda g: g.gpus)
            gang, gang_src = top.gpus, top.source
        else:
            best = max(training, key=lambda t: admissible_gang(cluster, t)[0])
            gang = admissible_gang(cluster, best)[0]
            gang_src = f"the largest gang partition {best} admits"
        peak = inp.peak(s)
        serving_need = peak.gpus if peak is not None else len(cluster.partition_gpus[s])
        frac = gang / farm
        if frac < LARGE_GANG_FRACTION and gang + serving_need <= farm:
            continue
        part = cluster.partitions[s]
        lends = [(k, r) for k, r in enumerate(part.lending) if set(r.to) & set(training)]
        shared = sorted(
            racks_of(cluster, s) & set().union(*(racks_of(cluster, t) for t in training))
        )
        if not lends and not shared:
            continue  # serving is its own hardware: a shared cluster with a fence
        breaches = []
        if lends:
            cap = sum(r.cap_gpus for _, r in lends)
            breaches.append(f"it lends up to {gpus(cap)} to training")
        if shared:
            breaches.append(f"it shares rack(s) {', '.join(shared)} (uplinks) with training")
        why = (
            f"The serving SLO of {s} (p99 {slo.p99_ms:g} ms, {slo.source}) is contractual and the "
            f"largest training gang is {gpus(gang)} ({gang_src}) = {pct(frac)} of the "
            f"{farm}-GPU farm, beside {gpus(serving_need)} serving needs; but the fence between "
            f"them is not hardware: {'; '.join(breaches)}. " + seeds.quote(seeds.WRONG_SHAPE)
        )
        limit = farm // 2 if frac >= LARGE_GANG_FRACTION else int(farm - serving_need)
        options = []
        edits: dict[str, list[Edit]] = {}
        if lends:
            options.append(f"stop lending from {s} (remove lending)")
            keep = tuple(r for k, r in enumerate(part.lending) if k not in {j for j, _ in lends})
            edits[s] = [(lending_line(part.lending), lending_line(keep) if keep else None)]
        if shared:
            options.append(
                f"put {s} on racks that training does not use (today {', '.join(shared)})"
            )
        fix = (
            f"Either make {s} a serving pool training cannot borrow ({'; '.join(options)}), "
            f"or move training bursts larger than {gpus(limit)} to a separate exclusive "
            f"environment. {seeds.quote(seeds.FENCE_IN_HARDWARE)}"
        )
        out.append(
            Advice(
                rules.WRONG_SHAPE,
                Severity.WARNING,
                ("partitions", s),
                why,
                {
                    "summary": f"contractual SLO on {s}, training gang {gang} GPUs = {pct(frac)} "
                    f"of {farm}, fence not hardware",
                    "partition": s,
                    "farm_gpus": farm,
                    "gang_gpus": gang,
                    "gang_fraction": round(frac, 4),
                    "serving_gpus": serving_need,
                    "shared_racks": shared,
                    "lends_gpus": sum(r.cap_gpus for _, r in lends),
                },
                fix,
                spec_diff(cluster, edits) if edits else "",
            )
        )
    return out
