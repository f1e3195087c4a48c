"""Free capacity of a pool per GPU, read off the ledger: the input of the fragmentation and
largest-gang measures (``telemetry.capacity``) for the simulator's timeline and the control
plane's ``/metrics`` alike, so both read the same ledger the same way.
"""

from __future__ import annotations

from gpufence.model.cluster import Cluster
from gpufence.model.mig import profiles_for
from gpufence.model.partition import SharingMode
from gpufence.state.ledger import Ledger

WHOLE = 1000  # milli-GPUs in a GPU (telemetry.capacity.WHOLE)


def pool_free_milli(ledger: Ledger, cluster: Cluster, pool: str) -> list[list[int]]:
    """Free milli-GPUs of each GPU of ``pool``, node by node (0 for down/blocked GPUs)."""
    sharing = cluster.partitions[pool].sharing
    out: list[list[int]] = []
    for n in cluster.partition_nodes[pool]:
        gids = cluster.node_partition_gpus[(pool, n)]
        if sharing in (SharingMode.EXCLUSIVE, SharingMode.TIME_SLICE):
            k = ledger.free_count[(pool, n)]  # whole free GPUs (holds and down nodes excluded)
            out.append([WHOLE] * k + [0] * (len(gids) - k))
            continue
        row: list[int] = []
        for g in gids:
            if not ledger.gpu_usable(g):
                row.append(0)
            elif sharing is SharingMode.MIG:
                row.append(_mig_free(ledger, cluster, g))
            else:  # fractional: what the shares leave of the GPU
                held = ledger.owner[g] is not None or bool(ledger.ts[g])
                row.append(0 if held else WHOLE - ledger.milli[g])
        out.append(row)
    return out


def _mig_free(ledger: Ledger, cluster: Cluster, g: int) -> int:
    """A MIG GPU with no busy instance is whole (it can be re-partitioned); otherwise its free
    instances' share of the 7 compute slices."""
    st = ledger.mig.get(g)
    if st is None or not st.busy():
        return WHOLE
    model = cluster.gpu_types[cluster.gpus[g].gpu_type].mig_model
    if model is None:
        return 0
    profiles = profiles_for(model)
    free = sum(
        profiles[inst.profile].compute_slices
        for inst, occ in zip(st.instances, st.occupant, strict=True)
        if occ is None
    )
    return WHOLE * free // 7
