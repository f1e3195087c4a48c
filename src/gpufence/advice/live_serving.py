"""Live rules about serving: chronic preemption (the reserve is too small, by how much and what
that costs training) and batch work in the serving queue. Pure functions over a ``History``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpufence.advice import catalog as rules
from gpufence.advice import seeds
from gpufence.advice.fence_resize import grow
from gpufence.advice.history import ENDED_BY_ITSELF, History, JobSpan, peak
from gpufence.advice.inputs import AdviceSettings, LintInputs, ServingPeak
from gpufence.advice.lint_fences import donors
from gpufence.advice.record import Advice, Scope, Severity, gpus, hours, job_list
from gpufence.advice.shape import admitting, node_gpus, serving_partitions
from gpufence.model.cluster import Cluster
from gpufence.model.job import WorkloadClass
from gpufence.model.partition import PreemptionMode

PREEMPTION_REASONS = ("incident-preemption", "on-demand-preemption")


def _in_window(j: JobSpan, h: History) -> bool:
    return j.submitted <= h.now and (j.ended is None or j.ended >= h.start)


def serving_peak(cluster: Cluster, h: History, partition: str) -> ServingPeak | None:
    """GPUs the partition's serving jobs wanted at once (running or waiting), at their peak."""
    spans = [
        (max(j.submitted, h.start), min(j.wanted_until(h.now), h.now), j.gpus)
        for j in h.jobs
        if j.workload_class == str(WorkloadClass.SERVING)
        and j.partition == partition
        and _in_window(j, h)
    ]
    most, at = peak(spans)
    if most <= 0:
        return None
    return ServingPeak(partition, most, f"history: at {h.when(at)}")


def largest_gangs(h: History) -> dict[str, JobSpan]:
    """The largest whole-GPU training gang seen per partition."""
    out: dict[str, JobSpan] = {}
    for j in h.jobs:
        if j.workload_class != str(WorkloadClass.TRAINING) or not _in_window(j, h):
            continue
        best = out.get(j.partition)
        if best is None or j.gpus > best.gpus:
            out[j.partition] = j
    return out


def _period_name(seconds: float) -> str:
    return "days" if seconds == 86400 else f"{seconds:g}-s periods"


def _preempting_partition(cluster: Cluster, h: History, victims: list[str]) -> str | None:
    homes = {a.partition for a in h.attempts if a.job_id in set(victims) and a.stop_reason} | {
        j.partition for j in h.jobs if j.id in set(victims)
    }
    candidates = [
        s
        for s in serving_partitions(cluster)
        if cluster.partitions[s].preemption.mode is not PreemptionMode.OFF
    ]
    for s in candidates:
        if homes & set(cluster.partitions[s].preemption.from_partitions):
            return s
    return candidates[0] if candidates else None


def _reserve_fix(
    cluster: Cluster,
    h: History,
    inp: LintInputs,
    s: str,
    peak_and_margin: tuple[float, int],
    evidence: dict[str, object],
) -> tuple[str, str]:
    """The fix for a serving reserve ``s`` that preempts chronically, and its spec diff: grow
    it (at what cost to whom), add hardware, or find the capacity it lacked when demand rose.
    Adds what it recommends to ``evidence``."""
    wanted, margin = peak_and_margin
    have = len(cluster.partition_gpus[s])
    need = wanted + margin
    change = grow(cluster, s, need, donors(cluster, s)) if need > have else None
    if change is None and need > have:
        return (
            f"Give {s} at least {gpus(need)}: serving's observed peak ({gpus(wanted)}) plus a "
            f"margin of {gpus(margin)}; the other partitions cannot give that many: add hardware.",
            "",
        )
    if change is None:
        lends = sum(r.cap_gpus for r in cluster.partitions[s].lending)
        return (
            f"Serving's observed peak ({gpus(wanted)}) plus a margin of {gpus(margin)} fits the "
            f"{have} GPUs of {s}, so the preemptions come from capacity it did not have when "
            "demand rose: "
            + (f"the up to {gpus(lends)} it lends out, " if lends else "")
            + "nodes that were down, or peaks shorter than the history shows. Fix that capacity "
            "(lend less, keep a node of margin) rather than preempting.",
            "",
        )
    size = change.size(s)
    evidence["recommended_gpus"] = size
    costs = _training_costs(cluster, h, s, change.gpus)
    evidence["training_cost"] = costs
    fix = (
        f"Grow the serving reserve {s} from {have} to {gpus(size)} (observed peak "
        f"{wanted:g} + margin {margin}). It costs: {'; '.join(costs)}."
    )
    return fix, change.diff(cluster, inp.queue_index)


def _training_costs(
    cluster: Cluster, h: History, s: str, after_change: Mapping[str, tuple[int, ...]]
) -> list[str]:
    """What each partition that gives GPUs to ``s`` loses: its size before and after, its
    peak use, and whether its largest gang still fits."""
    costs = []
    top = largest_gangs(h)
    for d, after in after_change.items():
        if d == s:
            continue
        before = len(cluster.partition_gpus[d])
        used, _ = peak(
            (a.start, a.end if a.end is not None else h.now, a.gpus)
            for a in h.attempts
            if a.partition == d and a.lent_from is None
        )
        text = f"{d} goes from {before} to {len(after)} GPUs (it used up to {used:g} at once"
        gang = top.get(d)
        if gang is not None:
            fits = gang.gpus <= len(after)
            text += f"; its largest gang, {gang.id} with {gpus(gang.gpus)}, " + (
                "still fits" if fits else "would no longer fit: see the wrong-shape rule"
            )
        costs.append(text + ")")
    return costs


def chronic_preemption(
    cluster: Cluster, h: History, settings: AdviceSettings, inp: LintInputs
) -> list[Advice]:
    cp = settings.chronic_preemption
    span = cp.of_last * cp.period_s
    stops = [
        m
        for m in h.marks
        if m.kind == "stop" and m.reason in PREEMPTION_REASONS and 0 <= h.now - m.t < span
    ]
    if not stops:
        return []
    seen = min(cp.of_last, max(1, math.ceil((h.now - h.start) / cp.period_s)))
    bar = (
        cp.more_than
        if seen >= cp.of_last
        else min(cp.more_than, max(1, math.floor(cp.more_than * seen / cp.of_last)))
    )
    hit = {math.floor((h.now - m.t) / cp.period_s) for m in stops}
    if len(hit) <= bar:
        return []
    victims = list(dict.fromkeys(m.job_id for m in stops))
    s = _preempting_partition(cluster, h, victims)
    if s is None:
        return []
    have = len(cluster.partition_gpus[s])
    demand = serving_peak(cluster, h, s)
    wanted = demand.gpus if demand is not None else float(have)
    margin = 0 if len(cluster.nodes) == 1 else settings.failure_margin_nodes * node_gpus(cluster, s)
    periods = _period_name(cp.period_s)
    why = (
        f"{len(stops)} preemptions for serving on {len(hit)} of the last {seen} {periods} "
        f"({h.span(m.t for m in stops)}; victims {job_list(victims)}). That is not an incident "
        f"any more: serving wanted up to {gpus(wanted)} at once"
        + (f" ({demand.source.removeprefix('history: ')})" if demand is not None else "")
        + f" and its fence {s} holds {have}. "
        + seeds.quote(seeds.CHRONIC)
        + " "
        + seeds.quote(seeds.HOPE)
    )
    evidence: dict[str, object] = {
        "summary": f"{len(stops)} preemptions on {len(hit)} of {seen} {periods}: the serving "
        f"reserve (partition {s}, {have} GPUs) is too small",
        "partition": s,
        "preemptions": len(stops),
        "periods_with_preemptions": len(hit),
        "periods_seen": seen,
        "period_s": cp.period_s,
        "first": h.when(min(m.t for m in stops)),
        "last": h.when(max(m.t for m in stops)),
        "victims": victims,
        "serving_gpus": have,
        "peak_serving_gpus": wanted,
        "margin_gpus": margin,
    }
    fix, diff = _reserve_fix(cluster, h, inp, s, (wanted, margin), evidence)
    return [
        Advice(
            rules.CHRONIC_PREEMPTION,
            Severity.WARNING,
            ("partitions", s),
            why,
            evidence,
            fix,
            diff,
            Scope.CLUSTER,
        )
    ]


def batch_in_serving(
    cluster: Cluster, h: History, settings: AdviceSettings, inp: LintInputs
) -> list[Advice]:
    serving = set(serving_partitions(cluster))
    flagged: dict[str, list[tuple[JobSpan, list[str]]]] = {}
    for j in h.jobs:
        if j.workload_class != str(WorkloadClass.SERVING) or j.slo_p99_ms is not None:
            continue  # a declared latency SLO: user-facing, whatever it looks like
        if j.partition not in serving or not _in_window(j, h):
            continue
        ran = sum(a.ran(h.now) for a in h.attempts_of(j.id))
        signs = []
        if j.ended_by == ENDED_BY_ITSELF and ran >= settings.batch_like_after_s:
            signs.append(f"ran {hours(ran)} and then exited on its own")
        if j.checkpointable:
            signs.append("checkpoints")
        if j.est_runtime_s is not None:
            signs.append(f"declares a run time ({hours(j.est_runtime_s)})")
        if signs:
            flagged.setdefault(j.partition, []).append((j, signs))
    out: list[Advice] = []
    batch_home = admitting(cluster, WorkloadClass.BATCH) or admitting(
        cluster, WorkloadClass.TRAINING
    )
    for p, found in flagged.items():
        ids = [j.id for j, _ in found]
        examples = "; ".join(f"{j.id} {', '.join(signs)}" for j, signs in found[:4])
        why = (
            f"{len(found)} serving-class job(s) in {p} declare no latency SLO and behave like "
            f"batch ({examples}{'; ...' if len(found) > 4 else ''}): a serving replica runs until "
            "it is scaled down and never checkpoints. " + seeds.quote(seeds.EVAL)
        )
        where = f" to {batch_home[0]}" if batch_home else ""
        fix = (
            f"This looks like batch eval: submit it as --class batch{where}; if it does serve "
            "users, declare the latency SLO it serves (--slo-p99-ms) so it is not mistaken for "
            "batch."
        )
        out.append(
            Advice(
                rules.BATCH_IN_SERVING,
                Severity.WARNING,
                (),
                why,
                {
                    "summary": f"{len(found)} serving job(s) in {p} look like batch eval",
                    "partition": p,
                    "jobs": ids,
                    "signs": {j.id: signs for j, signs in found},
                },
                fix,
                "",
                Scope.JOBS,
                tuple(sorted({j.tenant for j, _ in found})),
            )
        )
    return out
