"""Who may pass a gang's reservation (docs/architecture.md, "Reservations follow fair share"):
a job ahead of the gang in queue order -- higher priority, a queue fair share owes GPU time to,
serving where the fence protects it -- may take its reserved GPUs; jobs behind it may not,
unless they backfill (sched/partition_walk.py). Shared by the placement walk's per-job test
(``ahead``) and its per-shape filter once only reserved GPUs are left (``may_pass_holds``)."""

from __future__ import annotations

from collections.abc import Callable

from gpufence.model.job import WorkloadClass
from gpufence.model.partition import PreemptionMode
from gpufence.sched.backfill import INF
from gpufence.sched.context import Core, Reservation
from gpufence.sched.jobs import JobRecord
from gpufence.sched.queues import ShapeKey


def may_pass_holds(core: Core, res: Reservation) -> Callable[[ShapeKey], bool]:
    """Shapes that could still bind while the only free GPUs are ``res``'s holds: higher
    priority than the gang, of a queue ahead of the gang's by fair share (``ahead``), serving
    where the fence protects it, the gang's own, CPU-only, or
    an estimate bucket whose jobs may end
    before the gang starts (bound: half the bucket's floor, so float rounding of the bucket
    can only keep a shape too many, never one too few)."""
    q = core.queues
    gang = q.shape_of(res.job_id) if res.job_id in q else None
    room = res.start - core.now  # inf when the start is unknown: then no backfill at all
    protected = protects(core, res)
    backfills = core.cluster.partitions[res.pool].backfill
    lower = {qn for qn in core.cluster.partition_queues[res.pool] if ahead_by_share(core, qn, res)}

    def keep(sid: ShapeKey) -> bool:
        if sid == gang or q.priority(sid) > res.priority or q.gpus(sid) == 0:
            return True
        if q.priority(sid) == res.priority and q.queue(sid) in lower:
            return True
        if protected and q.serving(sid):
            return True
        b = q.bucket(sid)
        if b is None or not backfills or res.start == INF:
            return False
        return (0.0 if b <= 1 else 2.0 ** (b - 2)) <= room

    return keep


def protects(core: Core, res: Reservation) -> bool:
    """A fence that protects serving (preemption on) holds no reservation against it, unless
    the gang is serving itself and its start is known. A serving gang whose start is unknown
    (serving runs until it is scaled down: "when running jobs end" is never) gets its GPUs from
    protection's donor pools, not by holding idle GPUs of the fence: holding them would keep
    the serving jobs behind it beside idle GPUs for as long as protection needs (a minimum
    runtime, a budget window) or forever."""
    part = core.cluster.partitions[res.pool]
    if part.preemption.mode is PreemptionMode.OFF or res.job_id not in core.queues:
        return False
    gang = core.queues.records[res.job_id].job
    return gang.workload_class is not WorkloadClass.SERVING or res.start == INF


def ahead(core: Core, rec: JobRecord, res: Reservation) -> bool:
    """May ``rec`` take GPUs reserved for ``res``'s gang (ending the reservation)? A job of
    higher priority may, a serving job in a fence that protects serving, and a job that queue
    order puts ahead of the gang by fair share (docs/architecture.md, "Reservations follow fair
    share"): a reservation keeps jobs *behind* the gang off its GPUs, never those ahead of it."""
    job = rec.job
    if job.priority > res.priority:
        return True
    if job.workload_class is WorkloadClass.SERVING and protects(core, res):
        return True
    return job.priority == res.priority and ahead_by_share(core, rec.queue, res)


def ahead_by_share(core: Core, queue: str, res: Reservation) -> bool:
    """Is fair share behind on ``queue`` against the gang's queue: is its decayed usage per
    weight strictly lower (``FairShare.owed``)? The long-run account decides, not the share
    the walk orders by (which adds what a queue holds now): a gang's GPUs are held for it only
    while its queue has had at least the other's share of GPU time, so a queue of gangs cannot
    keep the GPUs by always holding the next reservation, nor a queue of small jobs keep a gang
    off them for longer than it takes to catch up. Jobs of the gang's own queue are never
    ahead: within a queue the gang keeps its place by submit time."""
    if queue == res.queue:
        return False
    fs = core.fairshare
    return fs.owed(queue) < fs.owed(res.queue)
