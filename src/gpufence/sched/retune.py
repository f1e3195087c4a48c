"""Run-time changes to what the cluster spec configured: a queue's weight and nominal quota, the
set of tenants (the events ``QueueRetuned`` and ``TenantsChanged``).

The front end never edits the core's state: it sends these events, and the next step applies
them before anything is placed. The core owns its own copy of the queue table
(``Scheduler.__init__`` copies it), so a change reaches every reader of ``cluster.queues`` --
fair share, admission, holdings, the invariants -- at once, and no other scheduler built from
the same spec (the simulator runs several) sees it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

from gpufence.model.events import QueueRetuned, TenantsChanged
from gpufence.model.partition import QueueSpec
from gpufence.sched.context import Core


def retune_queue(core: Core, ev: QueueRetuned) -> None:
    """New weight and quota for ``ev.queue``; an unknown queue is ignored (the front end checks
    names before it sends the event, and a store may outlive a queue the spec dropped)."""
    queues = cast(dict[str, QueueSpec], core.cluster.queues)
    spec = queues.get(ev.queue)
    if spec is None or ev.weight <= 0:
        return
    queues[ev.queue] = new = replace(spec, weight=ev.weight, nominal_milli=ev.nominal_milli)
    # a quota lowered below what the queue runs stops nothing: only new work waits. What runs
    # now is recorded as its allowance (the invariants'); admission keeps to the new quota
    used = core.ledger.queue_used[ev.queue]
    limit = (
        None
        if new.nominal_milli is None or new.borrowing_limit_milli is None
        else new.nominal_milli + new.borrowing_limit_milli
    )
    if limit is not None and used > limit:
        core.over_quota[ev.queue] = used
    else:
        core.over_quota.pop(ev.queue, None)
    # a raised quota (or a lighter rival) may let a job that waited fit now: placement skips a
    # partition where nothing changed since its last walk, so count this as a change there
    core.queues.added[spec.partition] += 1


def change_tenants(core: Core, ev: TenantsChanged) -> None:
    core.tenants = ev.tenants
