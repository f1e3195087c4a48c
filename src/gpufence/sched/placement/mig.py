"""MIG placement: take free GPU instances of the requested profile, packing busy GPUs first."""

from __future__ import annotations

from gpufence.model.decisions import Assignment, Reason
from gpufence.model.job import Job
from gpufence.sched.placement.base import NotPlaced, Placed, PlaceResult, node_admits
from gpufence.state.ledger import Ledger


def place_mig(ledger: Ledger, job: Job, pool: str) -> PlaceResult:
    c = ledger.cluster
    profile = job.request.mig_profile
    options: list[tuple[int, int, int, int]] = []  # (-busy instances, gid, instance idx, node)
    other_free = 0
    for g in c.partition_gpus[pool]:
        st = ledger.mig[g]
        node = c.gpus[g].node
        if not ledger.gpu_usable(g) or not node_admits(ledger, job, node):
            continue
        busy = sum(o is not None for o in st.occupant)
        for i, (inst, occ) in enumerate(zip(st.instances, st.occupant, strict=True)):
            if occ is not None:
                continue
            if inst.profile == profile:
                options.append((-busy, g, i, node))
            else:
                other_free += 1
    if len(options) < job.replicas:
        if other_free:
            return NotPlaced(
                Reason.MIG_LAYOUT,
                f"{len(options)} free {profile} instances in {pool} (needs {job.replicas}); "
                f"{other_free} free instances of other profiles",
            )
        return NotPlaced(Reason.NO_FIT, f"no free {profile} MIG instance in {pool}")
    options.sort()
    out: list[Assignment] = []
    per_node: dict[int, int] = {}
    for _, g, i, node in options:
        if not node_admits(ledger, job, node, per_node.get(node, 0) + 1):
            continue
        inst = ledger.mig[g].instances[i]
        out.append(Assignment(node=node, gpus=(g,), mig_profile=inst.profile, mig_start=inst.start))
        per_node[node] = per_node.get(node, 0) + 1
        if len(out) == job.replicas:
            return Placed(tuple(out))
    return NotPlaced(Reason.NO_FIT, f"not enough CPU/memory beside free {profile} instances")
