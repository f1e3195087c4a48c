"""Reservations for the head-of-line gang, so a stream of small jobs cannot starve it.

The earliest start is found by a binary search over the running jobs' expected end times
(``JobRecord.expected_end``: the time limit when there is one -- it is enforced --, else the
estimate): at a time T a node offers its free GPUs plus the GPUs of jobs expected to end by T.
Jobs without either, or already past their estimate, are assumed to run forever, so a gang that
needs their GPUs is reserved at T = inf: its GPUs are still held as they free up, and only jobs
that cannot delay it (none, at inf) backfill. When a job overruns its estimate the start passes
and the reservation is planned again (sched/partition_walk.py ``_valid``) without it, on GPUs
that will free up, instead of waiting on it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping

from gpufence.model.job import Job, RequestKind
from gpufence.sched.context import Core, Reservation
from gpufence.sched.jobs import JobRecord
from gpufence.sched.placement.whole import plan_on

INF = float("inf")


def reservable(core: Core, job: Job, pool: str) -> bool:
    """(Asked only in a sharing mode whose gangs reserve: ``PlacementMode.reserves``.) Only
    gangs of more than one whole GPU reserve: a 1-GPU job fits on any GPU that frees up, and
    queue order gives it the first one among the jobs behind it (jobs ahead of a reservation by
    fair share pass it: docs/architecture.md), while its reservation would keep the partition's
    one reservation from the gang queued behind it (which a 1-GPU stream would then starve).
    A partition with ``backfill: false`` reserves too: the switch turns off backfill into the
    reserved GPUs, not the gang's protection from the jobs behind it."""
    return job.request.kind is RequestKind.WHOLE and job.total_gpus > 1


def reserve(
    core: Core, records: Mapping[str, JobRecord], rec: JobRecord, pool: str
) -> Reservation | None:
    """The earliest start at which ``rec``'s gang fits in ``pool`` as running jobs end, and
    the GPUs it will get then (None: not even once every running job has ended)."""
    job = rec.job
    led = core.ledger
    now = core.now
    # nodes a maintenance window closes to the gang (it would still run when the window
    # begins) are left out, as down nodes are: holding their GPUs for it would keep the short
    # jobs that may use them before the window off them (state/closures.py)
    shut = set(core.closures.closed_for(job.time_limit_s, core.cluster.partition_nodes[pool]))
    free = {n: v for n, v in _free_by_node(core, pool).items() if n not in shut}
    releases, ending = _releases(core, records, pool, shut)
    ends = [r[0] for r in releases]

    def view(t: float) -> dict[int, list[int]]:
        # GPUs released by then come first, so the plan holds as few idle GPUs as it can
        out: dict[int, list[int]] = {}
        for _, node, gpus in releases[: bisect_right(ends, t)]:
            out.setdefault(node, []).extend(gpus)
        for n, v in free.items():
            out.setdefault(n, []).extend(v)
        return out

    base = {n: len(v) for n, v in free.items()}
    per = job.request.gpus

    def feasible(t: float) -> bool:
        counts = base.copy()
        for _, node, gpus in releases[: bisect_right(ends, t)]:
            counts[node] = counts.get(node, 0) + len(gpus)
        return sum(v // per for v in counts.values()) >= job.replicas

    if not feasible(INF):
        return None
    start = _first_feasible(sorted(set(ends) | {now}), feasible)
    planned = plan_on(led, job, view(start))
    if planned is None:  # per-node counts fit but topology does not: wait for everything
        start = INF
        planned = plan_on(led, job, view(INF))
        if planned is None:
            return None
    gpus = tuple(g for a in planned for g in a.gpus)
    counted = tuple(sorted((e, j) for j, e in ending.items() if e <= start and e < INF))
    overran = _overran(core, records, pool, gpus) if start == INF else ""
    return Reservation(job.id, pool, start, gpus, job.priority, rec.queue, counted, overran)


def _releases(
    core: Core, records: Mapping[str, JobRecord], pool: str, shut: set[int]
) -> tuple[list[tuple[float, int, tuple[int, ...]]], dict[str, float]]:
    """The GPUs each running job of ``pool`` gives back on an up node not ``shut`` to the
    gang, (expected end, node, GPUs) by end, and each job's expected end."""
    led = core.ledger
    releases: list[tuple[float, int, tuple[int, ...]]] = []
    ending: dict[str, float] = {}
    now, allocs, up = core.now, led.allocs, led.node_up  # (a look per running job of the pool)
    for jid in led.pool_allocs[pool]:
        end = ending[jid] = records[jid].expected_end(now)
        for a in allocs[jid].assignments:
            if up[a.node] and a.node not in shut:
                releases.append((end, a.node, a.gpus))
    releases.sort()  # (end, node, GPUs): the tuples' own order, compared in C
    return releases, ending


def _first_feasible(times: list[float], feasible: Callable[[float], bool]) -> float:
    """The first of ``times`` (sorted) at which the gang fits (binary search: feasibility only
    grows with time); inf when only once every running job has ended."""
    lo, hi = 0, len(times)
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(times[mid]):
            hi = mid
        else:
            lo = mid + 1
    return times[lo] if lo < len(times) else INF


class EasyBackfill:
    """The default rule (registered as ``easy``): the head-of-line multi-GPU gang of a
    whole-GPU partition reserves at its earliest start (``reserve``); a job not ahead of it
    may backfill into the reserved GPUs only with an estimate that ends by that start, and
    only where the partition allows backfill and the start is known."""

    def reservable(self, core: Core, job: Job, pool: str) -> bool:
        return reservable(core, job, pool)

    def reserve(
        self, core: Core, records: Mapping[str, JobRecord], rec: JobRecord, pool: str
    ) -> Reservation | None:
        return reserve(core, records, rec, pool)

    def may_backfill(self, core: Core, job: Job, res: Reservation) -> bool:
        planned = job.planned_runtime_s
        return (
            core.cluster.partitions[res.pool].backfill
            and res.start != INF  # start unknown: any backfill could delay the gang
            and planned is not None
            and core.now + planned <= res.start
        )


def _overran(core: Core, records: Mapping[str, JobRecord], pool: str, gpus: tuple[int, ...]) -> str:
    """The running jobs that hold GPUs the gang needs and ran past their estimates (a
    backfilled job, say, that was to end before the gang's start): the reason names them,
    since they, not "running jobs", keep the gang waiting."""
    led, now = core.ledger, core.now
    wanted = set(gpus)
    named: list[str] = []
    for jid in led.pool_allocs[pool]:
        rec = records[jid]
        est, began = rec.job.est_runtime_s, rec.started_at
        if est is None or began is None or rec.job.time_limit_s is not None:
            continue
        if began + est >= now:
            continue
        held = sum(1 for a in led.allocs[jid].assignments for g in a.gpus if g in wanted)
        if held:
            named.append(
                f"{jid} ran past its {est:g} s estimate, due t={began + est:g}, and holds "
                f"{held} of them"
            )
    return "; ".join(named)


def _free_by_node(core: Core, pool: str) -> dict[int, list[int]]:
    """Free GPUs per up node of ``pool`` that has any, in node order, from the ledger's
    free-count buckets: a 1,000-node pool is mostly full, and a node without free GPUs adds
    nothing to a view or a count (``plan_on`` only looks at nodes with GPUs)."""
    led = core.ledger
    nodes = sorted(n for bucket in led.buckets[pool][1:] for n in bucket)
    return {n: led.free_gpus(pool, n) for n in nodes if led.node_up[n]}
