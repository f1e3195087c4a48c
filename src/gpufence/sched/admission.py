"""Admission: the rules a job must pass before it is placed, and the one built in, quota with
cohort semantics (as in Kueue): nominal quota, borrowing and lending limits.

Admission rules are registered in ``sched/registry.py`` (``ADMISSION``) and run in that order
on every job the placement walk reaches; the first that refuses gives the job's pending reason.

All queues of a partition form its cohort. A queue may use its nominal quota; beyond it, it may
borrow up to its borrowing limit from what the other queues leave unused and are willing to lend
(each lends at most its lending limit of its unused nominal quota).
"""

from __future__ import annotations

from typing import Protocol

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Reason
from gpufence.sched.jobs import JobRecord
from gpufence.state.ledger import Ledger


class Admission(Protocol):
    """A rule a job must pass before it is placed. ``per_shape``: the answer is the same for
    every job of a walk shape (it depends only on the queue and the request), so a refusal is
    the whole shape's reason and the walk drops the shape; otherwise only the job is refused
    and the walk tries the next job of its shape."""

    reason: Reason  # the pending reason a refusal gives
    per_shape: bool

    def refuses(self, cluster: Cluster, ledger: Ledger, rec: JobRecord, charge: int) -> str | None:
        """Why ``rec`` (charged ``charge`` milli-GPU to its queue) may not start now, or None."""
        ...


class CohortQuota:
    """Nominal quota, borrowing and lending limits per queue (``quota_blocks``)."""

    reason = Reason.QUOTA
    per_shape = True  # shapes are per queue, and the charge is the request's

    def refuses(self, cluster: Cluster, ledger: Ledger, rec: JobRecord, charge: int) -> str | None:
        return quota_blocks(cluster, ledger, rec.queue, charge)


def quota_blocks(cluster: Cluster, ledger: Ledger, queue: str, charge: int) -> str | None:
    """Why admitting ``charge`` milli-GPU more to ``queue`` would break quota, or None."""
    spec = cluster.queues[queue]
    if spec.nominal_milli is None:
        return None
    after = ledger.queue_used[queue] + charge
    if after <= spec.nominal_milli:
        return None
    # past its nominal quota: the answer depends on the cohort's use and quotas as well. A walk
    # asks it for every shape of an over-quota queue, mostly with nothing bound in between: it
    # is kept while the ledger (its version: every change of a queue's use bumps it) and the
    # cohort's queue specs (replaced, never edited, when a queue is retuned) stay the same
    queues = cluster.queues
    cohort = [queues[q] for q in cluster.partition_queues[spec.partition]]
    key = ("quota", queue, charge)
    kept = ledger.derived.get(key)
    if isinstance(kept, tuple) and kept[0] == ledger.version and kept[1] == cohort:
        return kept[2]  # type: ignore[no-any-return]
    why = _beyond_nominal(cluster, ledger, queue, charge, after)
    ledger.derived[key] = (ledger.version, cohort, why)
    return why


def _beyond_nominal(
    cluster: Cluster, ledger: Ledger, queue: str, charge: int, after: int
) -> str | None:
    """``quota_blocks`` for a queue that would use ``after`` milli-GPU, past its nominal."""
    spec = cluster.queues[queue]
    assert spec.nominal_milli is not None
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
