"""MIG placement: take free GPU instances of the requested profile -- on a static layout packing
busy GPUs first, on a dynamic one where the instance keeps the most room for large profiles."""

from __future__ import annotations

from gpufence.model.decisions import Assignment, Reason
from gpufence.model.job import Job, RequestKind
from gpufence.model.mig import MigInstance
from gpufence.sched.placement.fit import NotPlaced, Placed, PlaceResult, node_admits
from gpufence.sched.placement.mig_rank import best_free, ranked
from gpufence.sched.placement.mig_room import CutKey
from gpufence.state.ledger import Ledger


def place_mig(ledger: Ledger, job: Job, pool: str) -> PlaceResult:
    profile = job.request.mig_profile
    assert profile is not None
    part = ledger.cluster.partitions[pool]
    if part.mig is not None and part.mig.dynamic:
        # a free instance that fits is taken (work conservation): the fragmentation-aware
        # ranking below already prefers busy GPUs, so an idle GPU is cut into last
        got = _take_dynamic(ledger, job, pool, profile)
    else:
        got = _take_static(ledger, job, pool, profile)
    if got is not None:
        return Placed(got)
    return _why_not(ledger, job, pool, profile)


def _options(ledger: Ledger, job: Job, pool: str, profile: str) -> list[tuple[int, int, int]]:
    """GPUs with a free instance of the profile, from the ledger's index: (-busy, gid, node),
    busiest GPUs first."""
    c = ledger.cluster
    options: list[tuple[int, int, int]] = []
    for g in ledger.mig_free.get((pool, profile), {}):
        node = c.gpus[g].node
        if ledger.gpu_usable(g) and node_admits(ledger, job, node):
            options.append((-ledger.mig[g].busy_count, g, node))
    options.sort()
    return options


def _take_static(
    ledger: Ledger, job: Job, pool: str, profile: str
) -> tuple[Assignment, ...] | None:
    """A fixed layout: any free instance of the profile is as good as another; pack busy GPUs."""
    out: list[Assignment] = []
    per_node: dict[int, int] = {}
    for _, g, node in _options(ledger, job, pool, profile):
        st = ledger.mig[g]
        for inst, occ in zip(st.instances, st.occupant, strict=True):
            if len(out) == job.replicas:
                break
            if occ is not None or inst.profile != profile:
                continue
            if not node_admits(ledger, job, node, per_node.get(node, 0) + 1):
                break
            out.append(Assignment(node=node, gpus=(g,), mig_profile=profile, mig_start=inst.start))
            per_node[node] = per_node.get(node, 0) + 1
        if len(out) == job.replicas:
            return tuple(out)
    return None


def _take_dynamic(
    ledger: Ledger, job: Job, pool: str, profile: str
) -> tuple[Assignment, ...] | None:
    """A dynamic layout: only running instances are fixed (idle ones can be re-cut), so take
    the free instance that keeps the most room for large profiles (``mig_room.cut_key``), one
    replica at a time, each pick seeing the ones before it."""
    if job.replicas == 1:
        return _take_one(ledger, job, pool, profile)
    c = ledger.cluster
    free = ledger.mig_free.get((pool, profile), {})
    taken: dict[int, list[MigInstance]] = {}  # GPU -> instances taken by this job's replicas
    out: list[Assignment] = []
    per_node: dict[int, int] = {}
    while len(out) < job.replicas:
        best: tuple[CutKey, int, int] | None = None
        for g, n_free in free.items():
            mine = taken.get(g, [])
            if len(mine) >= n_free or not ledger.gpu_usable(g):
                continue
            pick = best_free(ledger, g, profile, mine)
            if pick is None or (best is not None and (pick[0], g) >= best[:2]):
                continue  # (cheap test first: most GPUs lose on the key)
            node = c.gpus[g].node
            if node_admits(ledger, job, node, per_node.get(node, 0) + 1):
                best = (pick[0], g, pick[1])
        if best is None:
            return None
        _, g, start = best
        node = c.gpus[g].node
        taken.setdefault(g, []).append(MigInstance(profile, start))
        per_node[node] = per_node.get(node, 0) + 1
        out.append(Assignment(node=node, gpus=(g,), mig_profile=profile, mig_start=start))
    return tuple(out)


def _take_one(ledger: Ledger, job: Job, pool: str, profile: str) -> tuple[Assignment, ...] | None:
    """One replica: the best-ranked free instance on a node that admits the job -- the same
    pick as the loop of ``_take_dynamic``, from a ranking kept current (``mig_rank``)."""
    c = ledger.cluster
    for _, g, start in ranked(ledger, pool, profile):
        node = c.gpus[g].node
        if node_admits(ledger, job, node):
            return (Assignment(node=node, gpus=(g,), mig_profile=profile, mig_start=start),)
    return None


def _why_not(ledger: Ledger, job: Job, pool: str, profile: str) -> NotPlaced:
    if not ledger.nodes_down:  # usable unless blocked (a few GPUs being re-partitioned)
        # the ledger's counts, less those on blocked GPUs (asked for every MIG shape that
        # does not fit: no scan)
        key = (pool, profile)
        free_here = ledger.mig_free_count.get(key, 0) - ledger.mig_free_blocked.get(key, 0)
        free_any = ledger.mig_free_total.get(pool, 0) - ledger.mig_free_blocked_total.get(pool, 0)
        other = free_any - free_here
    else:
        mine = ledger.mig_free.get((pool, profile), {})
        free_here = sum(n for g, n in mine.items() if ledger.gpu_usable(g))
        other = sum(
            n
            for (p, prof), per in ledger.mig_free.items()
            if p == pool and prof != profile
            for g, n in per.items()
            if ledger.gpu_usable(g)
        )
    if free_here >= job.replicas:
        return NotPlaced(Reason.NO_FIT, f"not enough CPU/memory beside free {profile} instances")
    if other:
        return NotPlaced(
            Reason.MIG_LAYOUT,
            f"{free_here} free {profile} instances in {pool} (needs {job.replicas}); "
            f"{other} free instances of other profiles",
        )
    return NotPlaced(Reason.NO_FIT, f"no free {profile} MIG instance in {pool}")


class MigPlacer:
    """MIG partitions: GPU instances of a named profile, nothing else."""

    offers = frozenset({RequestKind.MIG})

    def place(self, ledger: Ledger, job: Job, pool: str) -> PlaceResult:
        return place_mig(ledger, job, pool)
