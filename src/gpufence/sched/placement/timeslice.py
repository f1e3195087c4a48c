"""Time-slice placement: up to N jobs per GPU; spread to the least-shared GPUs.

Co-location is recorded by the ledger (``Ledger.colocated``) so the simulator can apply the
time-slicing slowdown (research/contention.md §4.2-3).
"""

from __future__ import annotations

from gpufence.model.decisions import Assignment, Reason
from gpufence.model.job import Job, RequestKind
from gpufence.sched.placement.fit import NotPlaced, Placed, PlaceResult, node_admits
from gpufence.state.ledger import Ledger


def place_timeslice(ledger: Ledger, job: Job, pool: str) -> PlaceResult:
    c = ledger.cluster
    cap = c.partitions[pool].time_slice_max
    per = job.request.gpus
    extra: dict[int, int] = {}  # slots this gang already took, per GPU
    out: list[Assignment] = []
    for _ in range(job.replicas):
        best: tuple[int, int, tuple[int, ...]] | None = None
        for node in c.partition_nodes[pool]:
            if not node_admits(ledger, job, node, 1 + sum(a.node == node for a in out)):
                continue
            room = [
                (len(ledger.ts[g]) + extra.get(g, 0), g)
                for g in c.node_partition_gpus[(pool, node)]
                if ledger.gpu_usable(g)
                and ledger.owner[g] is None
                and len(ledger.ts[g]) + extra.get(g, 0) < cap
            ]
            if len(room) < per:
                continue
            room.sort()
            gpus = tuple(g for _, g in room[:per])
            load = sum(n for n, _ in room[:per])
            if best is None or (load, node) < best[:2]:
                best = (load, node, gpus)
        if best is None:
            return NotPlaced(Reason.NO_FIT, f"no node in {pool} has {per} GPU slots free")
        _, node, gpus = best
        for g in gpus:
            extra[g] = extra.get(g, 0) + 1
        out.append(Assignment(node=node, gpus=gpus, time_sliced=True))
    return Placed(tuple(out))


class TimeSlicePlacer:
    """Time-slice partitions: whole-GPU requests share GPUs in time, up to N jobs per GPU."""

    offers = frozenset({RequestKind.WHOLE})

    def place(self, ledger: Ledger, job: Job, pool: str) -> PlaceResult:
        return place_timeslice(ledger, job, pool)
