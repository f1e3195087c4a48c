"""Quota admission with cohort semantics (as in Kueue): nominal quota, borrowing and lending limits.

All queues of a partition form its cohort. A queue may use its nominal quota; beyond it, it may
borrow up to its borrowing limit from what the other queues leave unused and are willing to lend
(each lends at most its lending limit of its unused nominal quota).
"""

from __future__ import annotations

from gpufence.model.cluster import Cluster
from gpufence.state.ledger import Ledger


def quota_blocks(cluster: Cluster, ledger: Ledger, queue: str, charge: int) -> str | None:
    """Why admitting ``charge`` milli-GPU more to ``queue`` would break quota, or None."""
    spec = cluster.queues[queue]
    if spec.nominal_milli is None:
        return None
    after = ledger.queue_used[queue] + charge
    if after <= spec.nominal_milli:
        return None
    borrow = after - spec.nominal_milli
    if spec.borrowing_limit_milli is not None and borrow > spec.borrowing_limit_milli:
        return (
            f"queue {queue} would use {after / 1000:g} GPUs: nominal {spec.nominal_milli / 1000:g}"
            f" + borrowing limit {spec.borrowing_limit_milli / 1000:g}"
        )
    lendable = 0
    borrowed = 0
    for other in cluster.partition_queues[spec.partition]:
        if other == queue:
            continue
        o = cluster.queues[other]
        used = ledger.queue_used[other]
        if o.nominal_milli is None:
            continue
        unused = max(0, o.nominal_milli - used)
        lim = o.lending_limit_milli
        lendable += unused if lim is None else min(lim, unused)
        borrowed += max(0, used - o.nominal_milli)
    if borrow + borrowed > lendable:
        # what is left to lend after every queue's borrowing, this queue's own included
        left = lendable - borrowed - max(0, ledger.queue_used[queue] - spec.nominal_milli)
        nominal = spec.nominal_milli / 1000
        used_now = ledger.queue_used[queue]
        where = (
            f"is at its nominal quota ({nominal:g} GPUs)"
            if used_now >= spec.nominal_milli
            else f"would exceed its nominal quota of {nominal:g} GPUs (uses {used_now / 1000:g},"
            f" the job needs {charge / 1000:g})"
        )
        return (
            f"queue {queue} {where} and the cohort of {spec.partition} has "
            f"{max(0, left) / 1000:g} GPUs to lend"
        )
    return None


def quota_never_admits(cluster: Cluster, queue: str, charge: int) -> str | None:
    """A job larger than its queue could ever hold (nominal + borrowing limit) never runs."""
    spec = cluster.queues[queue]
    if spec.nominal_milli is None or spec.borrowing_limit_milli is None:
        return None
    limit = spec.nominal_milli + spec.borrowing_limit_milli
    if charge > limit:
        return f"needs {charge / 1000:g} GPUs but queue {queue} may hold at most {limit / 1000:g}"
    return None
