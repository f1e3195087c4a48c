"""Placement in fractional partitions: milli-GPU shares on one GPU, or whole GPUs on one node.

Candidates are generated per node (GPUs with equal free capacity are interchangeable, so only
one of each is scored) and ranked by the partition's scorer plugin.
"""

from __future__ import annotations

from gpufence.model.decisions import Assignment, Reason
from gpufence.model.job import MILLI_PER_GPU, Job, RequestKind
from gpufence.sched.placement.base import NotPlaced, Placed, PlaceResult, node_admits
from gpufence.sched.placement.scoring import NodeView, Scorer
from gpufence.sched.placement.whole import pick_gpus
from gpufence.state.ledger import Ledger


def _view(ledger: Ledger, pool: str, node: int, taken: dict[int, int], cpu: int) -> NodeView:
    c = ledger.cluster
    free = tuple(
        (MILLI_PER_GPU - ledger.milli[g] - taken.get(g, 0))
        if ledger.owner[g] is None and ledger.gpu_usable(g)
        else 0
        for g in c.node_partition_gpus[(pool, node)]
    )
    return NodeView(
        node=node,
        gpu_type=c.nodes[node].gpu_type,
        free=free,
        cpu_free=ledger.cpu_free(node) - cpu,
        mem_free=ledger.mem_free(node),
    )


def place_fractional(ledger: Ledger, job: Job, pool: str, scorer: Scorer) -> PlaceResult:
    c = ledger.cluster
    req = job.request
    taken: dict[int, int] = {}  # milli this gang already took per GPU (multi-replica gangs)
    taken_mem: dict[int, int] = {}
    host: dict[int, int] = {}  # replicas already put on each node
    out: list[Assignment] = []
    for _ in range(job.replicas):
        best: tuple[tuple[float, ...], Assignment] | None = None
        for node in c.partition_nodes[pool]:
            n_here = host.get(node, 0)
            if not node_admits(ledger, job, node, n_here + 1):
                continue
            view = _view(ledger, pool, node, taken, job.cpu_milli * n_here)
            gids = c.node_partition_gpus[(pool, node)]
            if req.kind is RequestKind.FRACTION:
                seen: set[tuple[int, int]] = set()
                for i, g in enumerate(gids):
                    f = view.free[i]
                    mem_left = ledger.gpu_mem_free(g) - taken_mem.get(g, 0)
                    if f < req.milli or mem_left < req.gpu_mem_mib or (f, mem_left) in seen:
                        continue
                    seen.add((f, mem_left))
                    after = (*view.free[:i], f - req.milli, *view.free[i + 1 :])
                    key = scorer.score(view, after, job)
                    if best is None or key < best[0]:
                        best = (key, Assignment(node, (g,), req.milli, req.gpu_mem_mib))
            else:
                whole = [g for i, g in enumerate(gids) if view.free[i] == MILLI_PER_GPU]
                if len(whole) < req.gpus:
                    continue
                gpus = pick_gpus(ledger, node, whole, req.gpus)
                after = tuple(0 if g in gpus else view.free[i] for i, g in enumerate(gids))
                key = scorer.score(view, after, job)
                if best is None or key < best[0]:
                    best = (key, Assignment(node, tuple(gpus)))
        if best is None:
            return NotPlaced(_why(ledger, job, pool), f"no GPU in {pool} fits {req.describe()}")
        a = best[1]
        out.append(a)
        host[a.node] = host.get(a.node, 0) + 1
        for g in a.gpus:
            taken[g] = taken.get(g, 0) + (a.milli if req.kind is RequestKind.FRACTION else 1000)
            taken_mem[g] = taken_mem.get(g, 0) + a.gpu_mem_mib
    return Placed(tuple(out))


def _why(ledger: Ledger, job: Job, pool: str) -> Reason:
    """No-fit when the pool lacks the capacity in aggregate, fragmented when it is scattered."""
    c = ledger.cluster
    free = sum(
        MILLI_PER_GPU - ledger.milli[g]
        for g in c.partition_gpus[pool]
        if ledger.owner[g] is None and ledger.gpu_usable(g)
    )
    want = job.request.milli if job.request.kind is RequestKind.FRACTION else 1000
    want *= job.request.gpus * job.replicas
    return Reason.FRAGMENTED if free >= want else Reason.NO_FIT
