"""Live rules about capacity that is held but not used: idle interactive sessions, lent GPUs
whose work is lost at reclaim, free GPUs scattered so that waiting gangs cannot start.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from statistics import median

from gpufence.advice import catalog as rules
from gpufence.advice import seeds
from gpufence.advice.fence_resize import Edit, carve, flow, lending_line, spec_diff
from gpufence.advice.history import AttemptSpan, History, JobSpan, peak, pending_spans
from gpufence.advice.inputs import AdviceSettings, LintInputs
from gpufence.advice.record import Advice, Scope, Severity, gpus, hours, job_list, pct
from gpufence.advice.shape import quota_max
from gpufence.model.cluster import Cluster
from gpufence.model.job import WorkloadClass
from gpufence.model.partition import SharingMode

_RECLAIM = "reclaim: {idle_threshold: 0.05, idle_after_s: 1800, warning_s: 300}"


def _clipped(a: AttemptSpan, h: History) -> float:
    end = a.end if a.end is not None else h.now
    return max(0.0, min(end, h.now) - max(a.start, h.start))


@dataclass(frozen=True)
class _IdleFinding:
    """What one partition's interactive sessions show: who, why, and the fix."""

    long: list[JobSpan]
    why: str
    fix: str
    diff: str
    path: tuple[str, ...]
    evidence: dict[str, object]


def idle_interactive(
    cluster: Cluster, h: History, settings: AdviceSettings, inp: LintInputs
) -> list[Advice]:
    out: list[Advice] = []
    for p, part in cluster.partitions.items():
        if WorkloadClass.INTERACTIVE not in part.admits:
            continue
        sessions = [
            j
            for j in h.jobs
            if j.workload_class == str(WorkloadClass.INTERACTIVE) and j.partition == p
        ]
        held = {j.id: sum(_clipped(a, h) for a in h.attempts_of(j.id)) for j in sessions}
        found = (
            _held_without_reclaim(cluster, p, sessions, held, settings)
            if part.reclaim is None
            else _kept_alive_by_touches(cluster, p, sessions, held, h)
        )
        if found is None:
            continue
        long = found.long
        out.append(
            Advice(
                rules.IDLE_INTERACTIVE,
                Severity.WARNING,
                found.path,
                found.why,
                {
                    "summary": f"{len(long)} interactive session(s) in {p} kept GPUs idle",
                    "partition": p,
                    "jobs": [j.id for j in long],
                    **found.evidence,
                },
                found.fix,
                found.diff,
                Scope.JOBS,
                tuple(sorted({j.tenant for j in long})),
            )
        )
    return out


def _held_without_reclaim(
    cluster: Cluster,
    p: str,
    sessions: list[JobSpan],
    held: dict[str, float],
    settings: AdviceSettings,
) -> _IdleFinding | None:
    """No reclaim policy: sessions that held GPUs longer than the advice's threshold."""
    long = [j for j in sessions if held[j.id] >= settings.interactive_hold_s]
    if not long:
        return None
    gpu_h = sum(held[j.id] * j.gpus for j in long) / 3600
    top = max(long, key=lambda j: held[j.id])
    why = (
        f"Partition {p} has no reclaim policy, and {len(long)} interactive session(s) "
        f"held GPUs for more than {hours(settings.interactive_hold_s)} "
        f"({gpu_h:.1f} GPU-hours; longest {top.id}, {hours(held[top.id])}). Nothing gives "
        "an idle session's GPUs back, and gpufence only watches activity where a "
        "reclaim policy asks for it. "
        + seeds.quote(seeds.NOTEBOOKS)
        + " "
        + seeds.quote(seeds.RECLAIM_INTERACTIVE)
    )
    fix = f"Add a reclaim policy to {p}: idle sessions are warned, then reclaimed."
    diff = spec_diff(cluster, {p: [(None, _RECLAIM)]})
    return _IdleFinding(
        long, why, fix, diff, ("partitions", p, "reclaim"), {"gpu_hours": round(gpu_h, 3)}
    )


def _kept_alive_by_touches(
    cluster: Cluster, p: str, sessions: list[JobSpan], held: dict[str, float], h: History
) -> _IdleFinding | None:
    """A reclaim policy: sessions warned idle again and again, and idle for most of the time
    they held their GPUs -- the policy's allowance renewed by touches, not by work."""
    pol = cluster.partitions[p].reclaim
    assert pol is not None
    kept = Counter(
        m.job_id for m in h.marks if m.kind == "notice-withdrawn" and m.reason == "active-again"
    )
    long = [
        j for j in sessions if kept[j.id] >= 2 and kept[j.id] * pol.idle_after_s >= 0.5 * held[j.id]
    ]
    if not long:
        return None
    idle_gpu_h = sum(kept[j.id] * pol.idle_after_s * j.gpus for j in long) / 3600
    top = max(long, key=lambda j: kept[j.id])
    why = (
        f"{len(long)} session(s) in {p} were warned idle {sum(kept[j.id] for j in long)} "
        f"times and became active just in time, every time ({top.id}: {kept[top.id]} "
        f"times): each warning means {hours(pol.idle_after_s)} of idle GPUs, so at least "
        f"{idle_gpu_h:.1f} GPU-hours sat idle beyond what the reclaim policy intends. A "
        "keep-alive that touches the GPU defeats it. " + seeds.quote(seeds.NOTEBOOKS)
    )
    better = min(1.0, round(max(pol.idle_threshold * 3, 0.15), 2))
    fix = (
        f"Make a touch not count as work: raise {p}'s reclaim.idle_threshold from "
        f"{pol.idle_threshold:g} to {better:g}, or shorten idle_after_s "
        f"({pol.idle_after_s:g} s)."
    )
    line = f"reclaim.idle_threshold: {pol.idle_threshold:g}"
    diff = spec_diff(cluster, {p: [(line, f"reclaim.idle_threshold: {better:g}")]})
    evidence: dict[str, object] = {
        "idle_gpu_hours_at_least": round(idle_gpu_h, 3),
        "warnings_withdrawn": {j.id: kept[j.id] for j in long},
    }
    path = ("partitions", p, "reclaim", "idle_threshold")
    return _IdleFinding(long, why, fix, diff, path, evidence)


def _lent_and_lost(h: History, lender: str) -> tuple[float, float, list[AttemptSpan]]:
    """GPU-seconds borrowers ran on ``lender``'s GPUs in the window, the GPU-seconds of work
    its reclaims threw away, and the reclaimed attempts."""
    borrowed = [a for a in h.attempts if a.lent_from == lender and _clipped(a, h) > 0]
    lent_s = sum(a.gpus * _clipped(a, h) for a in borrowed)
    reclaimed = [a for a in borrowed if a.stop_reason == "lent-reclaim"]
    lost_s = 0.0
    for a in reclaimed:
        # without a measured loss, an acknowledged notice means the checkpoint kept the work
        lost = a.lost_s if a.lost_s is not None else (0.0 if a.acked else a.ran(h.now))
        lost_s += a.gpus * min(lost, _clipped(a, h))
    return lent_s, lost_s, reclaimed


def _lending_fix(
    cluster: Cluster, lender: str, own_use: float, idle_floor: int, lasted: float
) -> tuple[str, dict[str, list[Edit]]]:
    """The fix for a lender whose borrowers lose their work, and its spec edits: stop lending
    when nothing was reliably idle, cap it at what was, else make the borrowers checkpoint."""
    part = cluster.partitions[lender]
    cap = len(cluster.partition_gpus[lender])
    edits: dict[str, list[Edit]] = {}
    cap_now = max((r.cap_gpus for r in part.lending), default=0)
    if idle_floor <= 0:
        fix = (
            f"Stop lending from {lender}: its own work used up to {own_use:g} of its {cap} "
            "GPUs, so nothing was reliably idle."
        )
        edits[lender] = [(lending_line(part.lending), None)]
    elif idle_floor < cap_now:
        fix = (
            f"Lend only what {lender} reliably leaves idle: its own work used up to "
            f"{own_use:g} of its {cap} GPUs, so cap_gpus {idle_floor}; and lend only to jobs "
            f"that checkpoint more often than a borrow lasts ({hours(lasted)})."
        )
        capped = [replace(r, cap_gpus=min(r.cap_gpus, idle_floor)) for r in part.lending]
        edits[lender] = [(lending_line(part.lending), lending_line(capped))]
    else:
        fix = (
            f"The cap is not the problem ({lender} never used more than {own_use:g} of its "
            f"{cap} GPUs): the borrowers lose their work because they do not checkpoint in "
            f"time. Lend only to jobs that checkpoint more often than a borrow lasts "
            f"({hours(lasted)}) and acknowledge the notice within the reclaim deadline."
        )
    return fix, edits


def lending_loses_work(
    cluster: Cluster, h: History, settings: AdviceSettings, inp: LintInputs
) -> list[Advice]:
    out: list[Advice] = []
    lenders = sorted({a.lent_from for a in h.attempts if a.lent_from})
    for lender in lenders:
        if lender not in cluster.partitions:
            continue
        lent_s, lost_s, reclaimed = _lent_and_lost(h, lender)
        if not reclaimed or lent_s <= 0 or lost_s / lent_s <= settings.lending_loss_ratio:
            continue
        ratio = lost_s / lent_s
        own_use, _ = peak(
            (a.start, a.end if a.end is not None else h.now, a.gpus)
            for a in h.attempts
            if a.partition == lender and a.lent_from is None
        )
        idle_floor = max(0, math.floor(len(cluster.partition_gpus[lender]) - own_use))
        no_ckpt = sum(1 for a in reclaimed if not a.acked)
        lasted = float(median(a.ran(h.now) for a in reclaimed))
        jobs = list(dict.fromkeys(a.job_id for a in reclaimed))
        why = (
            f"Borrowers of {lender}'s idle GPUs got {lent_s / 3600:.1f} GPU-hours on them and "
            f"lost {lost_s / 3600:.1f} ({pct(ratio)}) to {len(reclaimed)} reclaims "
            f"({h.span(a.end for a in reclaimed if a.end is not None)}): a borrow lasted "
            f"{hours(lasted)} (median) before {lender} took it back, and {no_ckpt} of them had "
            f"not checkpointed. Lending that loses most of the work only moves heat around. "
            + seeds.quote(seeds.INCIDENT)
        )
        fix, edits = _lending_fix(cluster, lender, own_use, idle_floor, lasted)
        out.append(
            Advice(
                rules.LENDING_LOSES_WORK,
                Severity.WARNING,
                ("partitions", lender, "lending"),
                why,
                {
                    "summary": f"borrowers of {lender} lost {pct(ratio)} of their lent GPU-hours",
                    "partition": lender,
                    "lent_gpu_hours": round(lent_s / 3600, 3),
                    "lost_gpu_hours": round(lost_s / 3600, 3),
                    "loss_ratio": round(ratio, 4),
                    "reclaims": len(reclaimed),
                    "jobs": jobs,
                },
                fix,
                spec_diff(cluster, edits),
                Scope.JOBS,
                tuple(sorted({j.tenant for j in h.jobs if j.id in set(jobs)})),
            )
        )
    return out


_Shape = tuple[str, int, int]  # a waiting gang's (queue, replicas, GPUs per replica)
# (time, order, kind, GPUs, job, attempt GPUs): releases first at equal times, then takes
_Step = tuple[float, int, str, tuple[int, ...], JobSpan | None, AttemptSpan | None]


def _stranding_steps(
    h: History,
    mine: set[int],
    quota_queue: Callable[[str], bool],
    waiting: list[tuple[JobSpan, list[tuple[float, float]]]],
) -> list[_Step]:
    """The partition's takes and releases of GPUs (and of quota) and its gangs' waits, in order."""
    steps: list[_Step] = []
    for at in h.attempts:
        held = tuple(g for g in at.gpu_ids if g in mine)
        end = at.end if at.end is not None else h.now
        if end > at.start and (held or quota_queue(at.job_id)):
            steps += [(at.start, 1, "take", held, None, at), (end, 0, "give", held, None, at)]
    for waiter, spans in waiting:
        for a, b in spans:
            steps += [(a, 2, "wait", (), waiter, None), (b, 0, "done", (), waiter, None)]
    steps.sort(key=lambda e: (e[0], e[1]))
    return steps


@dataclass
class _PartitionView:
    """One partition as the sweep sees it between two steps: free GPUs per node, the GPUs each
    quota-limited queue uses, and the shapes of the gangs waiting (with who waits in each)."""

    free: dict[int, int]
    node_of: dict[int, int]
    queue_of: dict[str, str]
    limit: dict[str, float | None]
    slack: int
    used: dict[str, float] = field(default_factory=dict)
    shapes: Counter[_Shape] = field(default_factory=Counter)
    who: dict[_Shape, dict[str, None]] = field(default_factory=dict)

    def quota_queue(self, job_id: str) -> bool:
        return self.queue_of.get(job_id) in self.limit

    def stranded(self) -> list[_Shape]:
        """The waiting shapes that fit the free GPUs in total (plus a node's slack) and their
        queue's quota, but not the free GPUs node by node."""
        hist = Counter(self.free.values())
        free_total = sum(self.free.values())
        return [
            s
            for s in self.shapes
            if s[1] * s[2] + self.slack <= free_total
            and sum(k // s[2] * c for k, c in hist.items()) < s[1]
            and ((q := self.limit.get(s[0])) is None or self.used.get(s[0], 0.0) + s[1] * s[2] <= q)
        ]

    def apply(self, step: _Step) -> None:
        _, _, kind, held, job, att = step
        for g in held:
            self.free[self.node_of[g]] += -1 if kind == "take" else 1
        if att is not None and self.quota_queue(att.job_id):
            owner = self.queue_of[att.job_id]
            self.used[owner] = self.used.get(owner, 0.0) + att.gpus * (1 if kind == "take" else -1)
        if job is not None:
            self._wait(job, kind == "wait")

    def _wait(self, job: JobSpan, starts: bool) -> None:
        shape = (job.queue, job.replicas, max(1, job.per_replica))
        if starts:
            self.shapes[shape] += 1
            self.who.setdefault(shape, {})[job.id] = None
            return
        self.shapes[shape] -= 1
        self.who[shape].pop(job.id, None)
        if self.shapes[shape] <= 0:
            del self.shapes[shape]


def _stranded_time(
    cluster: Cluster, h: History, p: str, waiting: list[tuple[JobSpan, list[tuple[float, float]]]]
) -> tuple[float, list[str], int, int]:
    """Seconds during which a waiting gang of ``p`` could not be placed although its queue's
    quota allowed it and a node's worth more GPUs than it needs were free, scattered; the jobs
    stranded; the most free GPUs and the largest free block on one node seen while stranded.

    The slack of a node keeps out the ordinary wait of a gang whose nodes are draining."""
    mine = set(cluster.partition_gpus[p])
    view = _PartitionView(
        free={n: len(cluster.node_partition_gpus[(p, n)]) for n in cluster.partition_nodes[p]},
        node_of={g: cluster.gpus[g].node for g in mine},
        queue_of={j.id: j.queue for j in h.jobs},
        limit={q: quota_max(cluster, q) for q in cluster.partition_queues[p]},
        slack=cluster.max_gpus_per_node(p),
    )
    total, worst_free, worst_block = 0.0, 0, 0
    stranded_ids: dict[str, None] = {}
    prev = h.start
    for step in _stranding_steps(h, mine, view.quota_queue, waiting):
        t = min(max(step[0], h.start), h.now)
        # the state before this step held from prev to t
        bad = view.stranded() if t > prev and view.shapes else []
        if bad:
            total += t - prev
            worst_free = max(worst_free, sum(view.free.values()))
            worst_block = max(worst_block, max(view.free.values(), default=0))
            for s in bad:
                stranded_ids.update(view.who[s])
        prev = max(prev, t)
        view.apply(step)
    return total, list(stranded_ids), worst_free, worst_block


def fragmentation_stranding(
    cluster: Cluster, h: History, settings: AdviceSettings, inp: LintInputs
) -> list[Advice]:
    out: list[Advice] = []
    window = max(h.now - h.start, 1e-9)
    for p, part in cluster.partitions.items():
        if part.sharing is not SharingMode.EXCLUSIVE or len(cluster.partition_nodes[p]) < 2:
            continue
        waiting = [
            (j, pending_spans(j, h.attempts_of(j.id), h.now))
            for j in h.jobs
            if j.partition == p and j.per_replica >= 1 and j.gpus > 1
        ]
        waiting = [(j, s) for j, s in waiting if s]
        if not waiting:
            continue
        total, ids, most_free, block = _stranded_time(cluster, h, p, waiting)
        if total < max(settings.stranded_min_s, settings.stranded_share * window):
            continue
        per_node = cluster.max_gpus_per_node(p)
        small = [
            j for j in h.jobs if j.partition == p and 0 < j.gpus < per_node and j.replicas == 1
        ]
        small_peak, _ = peak((j.submitted, j.wanted_until(h.now), j.gpus) for j in small)
        why = (
            f"For {hours(total)} ({pct(total / window)} of the {hours(window)} looked at) gangs "
            f"waited in {p} while enough of its GPUs were free but scattered: up to "
            f"{gpus(most_free)} free with at most {block} on one node (stranded: "
            f"{job_list(ids)}). " + seeds.quote(seeds.FRAGMENTATION)
        )
        fix = (
            f"Keep small jobs off the nodes gangs need: give jobs of fewer than {per_node} GPUs "
            f"a partition of their own"
            + (f" (they wanted up to {gpus(small_peak)} at once)" if small_peak else "")
            + ", so the rest drains to whole nodes; and have small jobs declare --est-runtime, "
            "so that backfill runs them only where they end before a waiting gang's start."
        )
        diff = ""
        if small_peak:
            nodes = max(1, math.ceil(small_peak / per_node))
            admits = f"admits: {flow(c for c in WorkloadClass if c in part.admits)}"
            change = carve(cluster, p, f"{p}-small", nodes * per_node, admits)
            diff = change.diff(cluster, inp.queue_index)
        out.append(
            Advice(
                rules.FRAGMENTATION_STRANDING,
                Severity.WARNING,
                ("partitions", p),
                why,
                {
                    "summary": f"gangs stranded {pct(total / window)} of the time in {p}",
                    "partition": p,
                    "stranded_s": round(total, 1),
                    "stranded_share": round(total / window, 4),
                    "most_free_gpus": most_free,
                    "largest_free_block": block,
                    "jobs": ids,
                },
                fix,
                diff,
                Scope.CLUSTER,
            )
        )
    return out
