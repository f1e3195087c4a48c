"""MIG placement: take free GPU instances of the requested profile, packing busy GPUs first."""

from __future__ import annotations

from gpufence.model.decisions import Assignment, Reason
from gpufence.model.job import Job, RequestKind
from gpufence.sched.placement.fit import NotPlaced, Placed, PlaceResult, node_admits
from gpufence.state.ledger import Ledger


def place_mig(ledger: Ledger, job: Job, pool: str) -> PlaceResult:
    c = ledger.cluster
    profile = job.request.mig_profile
    assert profile is not None
    # GPUs with a free instance of the profile, from the ledger's index; busiest GPUs first
    options: list[tuple[int, int, int]] = []  # (-busy instances, gid, node)
    for g in ledger.mig_free.get((pool, profile), {}):
        node = c.gpus[g].node
        if ledger.gpu_usable(g) and node_admits(ledger, job, node):
            options.append((-ledger.mig[g].busy_count, g, node))
    options.sort()
    out: list[Assignment] = []
    per_node: dict[int, int] = {}
    for _, g, node in options:
        st = ledger.mig[g]
        for inst, occ in zip(st.instances, st.occupant, strict=True):
            if len(out) == job.replicas:
                break
            if occ is not None or inst.profile != profile:
                continue
            if not node_admits(ledger, job, node, per_node.get(node, 0) + 1):
                break
            taken = any(a.gpus[0] == g and a.mig_start == inst.start for a in out)
            if taken:
                continue
            out.append(Assignment(node=node, gpus=(g,), mig_profile=profile, mig_start=inst.start))
            per_node[node] = per_node.get(node, 0) + 1
        if len(out) == job.replicas:
            return Placed(tuple(out))
    mine = ledger.mig_free.get((pool, profile), {})
    if not ledger.nodes_down:  # usable unless blocked (a few GPUs being re-partitioned)
        # counts, less the free instances on this pool's blocked GPUs
        blocked = [g for g in ledger.blocked if c.gpus[g].partition == pool]
        free_here = sum(mine.values()) - sum(mine.get(g, 0) for g in blocked)
        free_any = ledger.mig_free_total.get(pool, 0) - sum(
            ledger.mig[g].occupant.count(None) for g in blocked
        )
        other = free_any - free_here
    else:
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
