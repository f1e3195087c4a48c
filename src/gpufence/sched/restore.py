"""Taking back running jobs after a front-end restart (crash recovery).

The control plane persists every Bind before it starts processes. When it restarts, a fresh
scheduler learns which jobs still hold which GPUs from ``JobRestored`` events, applied before any
placement, so nothing is placed on GPUs that live processes use. A restore that contradicts the
ledger (a GPU already taken, an unknown node) is a corrupted store, not a scheduling question:
it raises, naming the job, instead of silently double-booking a GPU.
"""

from __future__ import annotations

from gpufence.model import mig as migmod
from gpufence.model.decisions import Reason
from gpufence.model.events import JobRestored
from gpufence.model.job import RequestKind
from gpufence.sched.book import JobBook
from gpufence.sched.context import Core
from gpufence.sched.intake import Refused, resolve
from gpufence.sched.jobs import JobRecord, JobState
from gpufence.sched.jobs import Notice as NoticeState
from gpufence.sched.reclaim import track
from gpufence.state.ledger import Allocation, charge_milli

# notices that took a slot of a budget when they were given (incident, MIG defrag)
COUNTED_NOTICES = frozenset(
    (Reason.INCIDENT_PREEMPTION, Reason.ON_DEMAND_PREEMPTION, Reason.MIG_DEFRAG)
)


class RestoreConflict(ValueError):
    """A restored job's GPUs are not free in the ledger (or do not exist)."""


def _conflict(core: Core, ev: JobRestored) -> str | None:
    led = core.ledger
    n_gpus = len(led.owner)
    if ev.pool not in core.cluster.partitions:
        return f"partition '{ev.pool}' is not in the cluster spec"
    if len(ev.assignments) != ev.job.replicas:
        return f"{len(ev.assignments)} assignments for {ev.job.replicas} replicas"
    kind = ev.job.request.kind
    for a in ev.assignments:
        for g in a.gpus:
            if not 0 <= g < n_gpus:
                return f"GPU {g} does not exist"
        if a.mig_profile is not None:
            st = led.mig.get(a.gpus[0])
            inst = migmod.MigInstance(a.mig_profile, a.mig_start or 0)
            if st is None or inst not in st.instances:
                return f"GPU {a.gpus[0]} has no MIG instance {a.mig_profile}@{a.mig_start}"
            if st.occupant[st.instances.index(inst)] is not None:
                return f"MIG instance {a.mig_profile}@{a.mig_start} on GPU {a.gpus[0]} is taken"
        elif kind is RequestKind.WHOLE and not a.time_sliced:
            for g in a.gpus:
                if led.owner[g] is not None:
                    return f"GPU {g} is already held by {led.owner[g]}"
    return None


def restore(core: Core, book: JobBook, ev: JobRestored) -> None:
    job = ev.job
    if job.id in book.records:
        raise RestoreConflict(f"job {job.id}: restored twice or after it was submitted")
    got = resolve(core.cluster, job, core.ledger.mig, core.tenants)
    if isinstance(got, Refused):
        raise RestoreConflict(f"job {job.id}: the cluster spec no longer admits it: {got.message}")
    problem = _conflict(core, ev)
    if problem is not None:
        raise RestoreConflict(f"job {job.id}: {problem}")
    rec = JobRecord(job, got.home, got.queue, JobState.RUNNING, attempt=ev.attempt)
    rec.started_at = ev.started_at
    rec.last_active = core.now
    book.records[job.id] = rec
    core.ledger.allocate(
        Allocation(
            job=job,
            home=got.home,
            queue=got.queue,
            pool=ev.pool,
            assignments=ev.assignments,
            charge_milli=charge_milli(job, core.cluster, ev.pool),
            lent_from=ev.lent_from,
            # outside its home without a lending rule = on capacity an incident freed
            incident=ev.pool != got.home and ev.lent_from is None,
        )
    )
    core.engine.observe(job, got.home)
    if ev.stopping is not None:
        rec.state = JobState.STOPPING
        book.stopping[job.id] = None
        rec.stop_reason = ev.stopping
        rec.requeue_on_stop = ev.requeue
    else:
        home = core.cluster.partitions[got.home]
        if ev.notice is not None:
            # a notice in flight: the same deadline; its budget slot came back with
            # PreemptionsRestored (a MIG defrag's: DefragsRestored), so it is not counted again
            reason, deadline = ev.notice
            rec.notice = NoticeState(reason, deadline, reason in COUNTED_NOTICES)
            book.noticed[job.id] = None
            book.inflight_changes += 1
        book.arm_limit(rec, home.preemption.grace_s)
        if home.reclaim is not None:
            book.interactive[job.id] = None
            track(core.cluster, book, rec)
