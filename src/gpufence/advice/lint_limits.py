"""Spec rules about the limits around the fences: how fast lent GPUs come back, gangs that only
fit on borrowed (or no) GPUs, preemption of work that cannot checkpoint, quota promises that
borrowing can break. Pure functions: ``(cluster, inputs) -> list[Advice]``.
"""

from __future__ import annotations

import math

from gpufence.advice import catalog as rules
from gpufence.advice import seeds
from gpufence.advice.fence_resize import flow, spec_diff
from gpufence.advice.inputs import LintInputs
from gpufence.advice.record import Advice, Severity, gpus
from gpufence.advice.shape import (
    admissible_gang,
    lent_in,
    nominal_total,
    quota_max,
    serving_partitions,
    slots,
)
from gpufence.model.cluster import Cluster
from gpufence.model.job import MILLI_PER_GPU, WorkloadClass
from gpufence.model.partition import PreemptionMode, QueueSpec, SharingMode


def lending_reclaim_slow(cluster: Cluster, inp: LintInputs) -> list[Advice]:
    out: list[Advice] = []
    for s in serving_partitions(cluster):
        slo = inp.slo(cluster, s)
        if slo is None:
            continue
        for k, rule in enumerate(cluster.partitions[s].lending):
            d, w = rule.reclaim_deadline_s, slo.window_s
            if d < w:
                continue
            better = math.floor(w / 2)
            why = (
                f"{s} lends up to {gpus(rule.cap_gpus)} to {', '.join(rule.to)} and takes them "
                f"back with a {d:g}-s reclaim deadline, but its p99 SLO ({slo.p99_ms:g} ms, "
                f"{slo.source}) is judged over {w:g}-s windows: when its demand returns, serving "
                f"waits up to {d:g} s for its own GPUs, so every reclaim can cost a whole window "
                "out of SLO. Lending is safe only when a reclaim completes inside one window. "
                + seeds.quote(seeds.RESERVE)
            )
            path = ("partitions", s, "lending", k, "reclaim_deadline_s")
            diff = spec_diff(
                cluster,
                {
                    s: [
                        (f"lending[{k}].reclaim_deadline_s: {d:g}", None),
                        (None, f"lending[{k}].reclaim_deadline_s: {better}"),
                    ]
                },
            )
            out.append(
                Advice(
                    rules.LENDING_RECLAIM_SLOW,
                    Severity.WARNING,
                    path,
                    why,
                    {
                        "summary": f"{s} reclaims lent GPUs in {d:g} s; its SLO window is {w:g} s",
                        "partition": s,
                        "reclaim_deadline_s": d,
                        "slo_window_s": w,
                    },
                    f"Set reclaim_deadline_s below the SLO window, e.g. {better} (borrowers must "
                    f"checkpoint within it), or stop lending from {s}.",
                    diff,
                )
            )
    return out


def gang_exceeds_capacity(cluster: Cluster, inp: LintInputs) -> list[Advice]:
    out: list[Advice] = []
    for p, part in cluster.partitions.items():
        if part.sharing in (SharingMode.MIG, SharingMode.FRACTIONAL):
            continue  # their work is one instance / share per replica, not gangs of GPUs
        own = slots(cluster, p)
        lent = sum(cap for _, _, cap in lent_in(cluster, p))
        admissible, bound = admissible_gang(cluster, p)
        seen = inp.gang(p)
        # gangs the workload really brings are a warning; ones the spec merely admits, a note
        severity = Severity.WARNING if seen is not None else Severity.INFO
        if seen is not None and seen.gpus > own + lent:
            what = (
                f"The workload brings gangs of up to {gpus(seen.gpus)} to {p} ({seen.source}), "
                f"but it holds {own}"
                + (f" (+{lent} lendable)" if lent else "")
                + ": those jobs are rejected at submit (never-fits)."
            )
            fix = f"Grow {p} to at least {gpus(seen.gpus)}, or send those gangs elsewhere."
            size = seen.gpus
        elif seen is not None and seen.gpus > own:
            what = (
                f"The workload brings gangs of up to {gpus(seen.gpus)} to {p} ({seen.source}), "
                f"more than its own {own}: they fit only on GPUs other partitions lend."
            )
            fix = f"Grow {p} to {gpus(seen.gpus)}, or keep its gangs within {gpus(own)}."
            size = seen.gpus
        elif seen is None and admissible > own:
            what = (
                f"Partition {p} admits gangs of up to {gpus(admissible)} ({bound}), but only "
                f"{own} are its own: a larger gang fits only on lent GPUs."
            )
            fix = (
                f"Cap {p}'s gangs at its own {gpus(own)}: give its queues nominal_gpus and a "
                f"borrowing_limit_gpus that add up to at most {own}."
            )
            size = admissible
        else:
            continue
        why = what
        if size > own and size <= own + lent:
            why += (
                " Such a gang waits until the lender is idle enough, holds the partition's "
                "head-of-line reservation meanwhile (starving smaller work), and is the first "
                "thing a reclaim stops."
            )
        out.append(
            Advice(
                rules.GANG_EXCEEDS_CAPACITY,
                severity,
                ("partitions", p),
                why,
                {
                    "summary": f"gangs of {size} GPUs on {p}, which holds {own}",
                    "partition": p,
                    "gang_gpus": size,
                    "own_gpus": own,
                    "lendable_gpus": lent,
                },
                fix,
            )
        )
    return out


_INCIDENT = (
    "preemption: {mode: incident-only, from: %s, budget: 4, window_s: 86400, "
    "min_runtime_s: 600, grace_s: 120}"
)


def preempts_non_checkpointable(cluster: Cluster, inp: LintInputs) -> list[Advice]:
    out: list[Advice] = []
    for s in serving_partitions(cluster):
        part = cluster.partitions[s]
        pol = part.preemption
        if pol.mode is PreemptionMode.ON_DEMAND:
            victims = sorted(
                {
                    str(c)
                    for f in pol.from_partitions
                    if f in cluster.partitions
                    for c in cluster.partitions[f].admits
                    if c is not WorkloadClass.SERVING
                }
            )
            why = (
                f"{s} preempts on demand: whenever serving wants GPUs it stops {', '.join(victims)}"
                f" jobs in {', '.join(pol.from_partitions)}, whether they can checkpoint or not, "
                "without a budget or a minimum run time: their work since the start is lost. "
                + seeds.quote(seeds.INCIDENT)
                + " "
                + seeds.quote(seeds.HOPE)
            )
            old = f"preemption: {{mode: on-demand, from: {flow(pol.from_partitions)}, ...}}"
            out.append(
                Advice(
                    rules.PREEMPTS_NON_CHECKPOINTABLE,
                    Severity.WARNING,
                    ("partitions", s, "preemption", "mode"),
                    why,
                    {
                        "summary": f"{s} preempts {', '.join(victims)} on demand",
                        "partition": s,
                        "victim_classes": victims,
                    },
                    "Use mode: incident-only (checkpointable victims only, older than "
                    "min_runtime_s, at most budget per window_s) and size the serving reserve so "
                    "that it is rarely needed.",
                    spec_diff(cluster, {s: [(old, _INCIDENT % flow(pol.from_partitions))]}),
                )
            )
        for k, rule in enumerate(part.lending):
            if rule.checkpointable_only:
                continue
            why = (
                f"{s} lends up to {gpus(rule.cap_gpus)} to {', '.join(rule.to)} with "
                "checkpointable_only: false: a borrower that cannot checkpoint loses everything "
                f"it did on them each time {s} takes them back. " + seeds.quote(seeds.INCIDENT)
            )
            key = f"lending[{k}].checkpointable_only"
            out.append(
                Advice(
                    rules.PREEMPTS_NON_CHECKPOINTABLE,
                    Severity.WARNING,
                    ("partitions", s, "lending", k, "checkpointable_only"),
                    why,
                    {
                        "summary": f"{s} lends to work that cannot checkpoint",
                        "partition": s,
                        "lending_rule": k,
                    },
                    "Lend only to checkpointable work (checkpointable_only: true).",
                    spec_diff(cluster, {s: [(f"{key}: false", f"{key}: true")]}),
                )
            )
    return out


def quota_borrow_unbounded(cluster: Cluster, inp: LintInputs) -> list[Advice]:
    out: list[Advice] = []
    for p in cluster.partitions:
        queues = [cluster.queues[q] for q in cluster.partition_queues[p]]
        cap = len(cluster.partition_gpus[p])
        total = nominal_total(cluster, p)
        if not any(q.nominal_milli is not None for q in queues):
            continue
        if round(total * MILLI_PER_GPU) < cap * MILLI_PER_GPU:
            continue  # unpromised GPUs are left: quotas can still be met from them
        for q in queues:
            if q.nominal_milli is not None and q.borrowing_limit_milli is not None:
                continue
            lenders = [
                o
                for o in queues
                if o.name != q.name
                and o.nominal_milli is not None
                and (o.lending_limit_milli is None or o.lending_limit_milli > 0)
            ]
            if lenders:
                out.append(_unbounded_borrower(cluster, inp, p, q, lenders))
    return out


def _unbounded_borrower(
    cluster: Cluster, inp: LintInputs, p: str, q: QueueSpec, lenders: list[QueueSpec]
) -> Advice:
    """The advice for queue ``q`` of partition ``p``, whose quotas cover every GPU: ``q`` has
    no quota, or no borrowing limit, so it can hold what ``lenders`` lend."""
    cap = len(cluster.partition_gpus[p])
    total = nominal_total(cluster, p)
    lendable = (
        sum(
            (o.nominal_milli if o.lending_limit_milli is None else o.lending_limit_milli) or 0
            for o in lenders
        )
        / MILLI_PER_GPU
    )
    who = ", ".join(o.name for o in lenders)
    head = f"The queues of {p} promise {total:g} of its {cap} GPUs as nominal quota, and "
    if q.nominal_milli is None:
        head += (
            f"queue {q.name} has no quota at all: its jobs ignore quota and can take "
            f"any free GPU, including the guaranteed quota of {who}."
        )
        path = inp.queue_path(q.name, "nominal_gpus")
        fix = (
            f"Give {q.name} a nominal_gpus share (take it from the others' quotas) and "
            "a borrowing_limit_gpus."
        )
        line = "nominal_gpus: <its share>"
    else:
        limit = max(1, math.floor(lendable / 2))
        head += (
            f"queue {q.name} may borrow without a limit: it can hold the "
            f"{gpus(lendable)} that {who} {'lends' if len(lenders) == 1 else 'lend'} "
            "while idle."
        )
        path = inp.queue_path(q.name, "borrowing_limit_gpus")
        fix = (
            f"Give {q.name} a borrowing limit (borrowing_limit_gpus: {limit}, half of "
            f"what the others lend), or give {who} lending_limit_gpus."
        )
        line = f"borrowing_limit_gpus: {limit}"
    diff = spec_diff(cluster, {}, {q.name: [(None, line)]}, inp.queue_index)
    why = head + (
        " gpufence never preempts a borrower to give quota back, so when the lenders "
        "return, their guaranteed quota waits until the borrower's jobs end (hours, for "
        "heavy-tailed training)."
    )
    facts = {
        "summary": f"{p}: quotas cover all {cap} GPUs; {q.name} borrows without a limit",
        "partition": p,
        "queue": q.name,
        "nominal_total_gpus": total,
        "capacity_gpus": cap,
        "lenders": [o.name for o in lenders],
        "lendable_gpus": lendable,
        "queue_max_gpus": quota_max(cluster, q.name),
    }
    return Advice(rules.QUOTA_BORROW_UNBOUNDED, Severity.WARNING, path, why, facts, fix, diff)
