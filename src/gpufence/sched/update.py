"""Changing a job after submit (``JobUpdated``, as Slurm's ``scontrol update``).

``judge`` is the one verdict on a change, shared by the core and the front ends: a front end
asks it before it stores the change (and answers the user with its refusal), and the core asks
it again when the event arrives, so no front end keeps rules of its own about what a change may
do. What it allows:

- a pending job may change its priority, time limit, partition and queue; it is routed again
  exactly as at submit (``intake.resolve``: the partition must exist and admit the job, the
  request must fit it, the queue must be one of the partition's and its quota able to hold it);
- a running job may change its priority and time limit only: its GPUs are in its partition
  and charged to its queue (``Conflict`` for a partition or queue, naming the state and what to
  do instead). A new limit counts from the attempt's start, through the same deadline heap as
  at bind (``JobBook.arm_limit``): one already past stops it at the next step;
- any other state: ``Conflict`` (an ended job changes no more; a stopping one is on its way out).

Who may make which change (a tenant may only lower a time limit, say) is the front end's
business: the core has no notion of callers. ``apply_update`` is phase 1's hook (apply.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Decision, NoticeWithdrawn, Reason
from gpufence.model.events import JobUpdated
from gpufence.model.job import Job
from gpufence.sched.book import JobBook
from gpufence.sched.context import Claims, Core
from gpufence.sched.gates import Gates
from gpufence.sched.intake import Accepted, MigLayouts, Refused, invalid, resolve
from gpufence.sched.jobs import JobRecord, JobState
from gpufence.sched.reasons import PendingReasons


@dataclass(frozen=True, slots=True)
class Conflict:
    """The job's state does not allow the change (HTTP 409): the message names the state and
    what to do instead."""

    message: str


def changed(job: Job, ev: JobUpdated) -> Job:
    """``job`` with the fields ``ev`` sets."""
    fields: dict[str, object] = {}
    if ev.priority is not None:
        fields["priority"] = ev.priority
    if ev.time_limit_s is not None:
        fields["time_limit_s"] = ev.time_limit_s
    if ev.partition is not None:
        fields["partition"] = ev.partition
    if ev.queue is not None:
        fields["queue"] = ev.queue
    return replace(job, **fields)  # type: ignore[arg-type]


def judge(
    cluster: Cluster,
    rec: JobRecord | None,
    ev: JobUpdated,
    mig_now: MigLayouts | None = None,
    tenants: frozenset[str] | None = None,
) -> Accepted | Refused | Conflict:
    """Whether ``rec`` may take the change ``ev``: where it then lives (``Accepted``), why
    its new values can never run (``Refused``, as a submit would be), or why its state does
    not allow it (``Conflict``)."""
    if rec is None:
        return Conflict(f"job {ev.job_id} is not pending or running: an ended job cannot change")
    state = rec.state
    moves = ev.partition is not None or ev.queue is not None
    if state is JobState.RUNNING and moves:
        return Conflict(
            f"job {ev.job_id} is running: its partition and queue change only while it is "
            "pending; cancel it and submit it again to the other partition or queue (its "
            "priority and time limit may change while it runs)"
        )
    if state not in (JobState.PENDING, JobState.RUNNING):
        return Conflict(f"job {ev.job_id} is {state}: only a pending or running job can change")
    new = changed(rec.job, ev)
    if state is JobState.RUNNING:
        bad = invalid(new)
        return bad if bad is not None else Accepted(rec.home, rec.queue)
    return resolve(cluster, new, mig_now, tenants)


def apply_update(
    core: Core,
    book: JobBook,
    claims: Claims,
    reasons: PendingReasons,
    gates: Gates,
    ev: JobUpdated,
    out: list[Decision],
) -> None:
    """Phase 1's hook for ``JobUpdated``: a change ``judge`` refuses is dropped."""
    rec = book.records.get(ev.job_id)
    verdict = judge(core.cluster, rec, ev, core.ledger.mig, core.tenants)
    if rec is None or not isinstance(verdict, Accepted):
        return
    new = changed(rec.job, ev)
    for p, res in list(claims.reservations.items()):  # planned on the job as it was
        if res.job_id == rec.job.id or any(j == rec.job.id for _, j in res.counted):
            del claims.reservations[p]
    if rec.state is JobState.PENDING:
        _pending(core, claims, reasons, gates, rec, new, verdict)
        return
    old_limit = rec.job.time_limit_s
    rec.job = new
    if new.time_limit_s == old_limit:
        return
    book.arm_limit(rec, core.cluster.partitions[rec.home].preemption.grace_s)
    n = rec.notice
    limit = new.time_limit_s
    if n is not None and n.reason is Reason.TIME_LIMIT and limit is not None:
        assert rec.started_at is not None
        end = rec.started_at + limit
        if end > n.deadline:  # a later end: the notice no longer applies (re-armed above)
            book.withdraw(rec)
            msg = f"time limit changed to {limit:g} s: it now ends at t={end:g}"
            out.append(NoticeWithdrawn(rec.job.id, Reason.TIME_LIMIT, msg))


def replan(claims: Claims, partition: str) -> None:
    """A job joins ``partition``'s queue at a place that may be ahead of the gang holding its
    reservation (released from a hold, moved there, updated): the reservation was planned on
    the queue without it, and would keep it off the GPUs even where it comes first. Dropped,
    it is planned again by the next walk for whichever job then heads the queue."""
    claims.reservations.pop(partition, None)


def _pending(
    core: Core,
    claims: Claims,
    reasons: PendingReasons,
    gates: Gates,
    rec: JobRecord,
    new: Job,
    home: Accepted,
) -> None:
    """A pending job takes its new values: out of its queue and back in, at its own place
    (``JobRecord.arrival``) in the order the new priority gives; a gated one stays gated."""
    jid = rec.job.id
    queued = jid in core.queues
    if queued:
        core.queues.remove(jid)
    reasons.forget(jid)
    claims.nominations.pop(jid, None)
    claims.plans.pop(jid, None)
    moved = home.home != rec.home
    rec.job, rec.home, rec.queue = new, home.home, home.queue
    if moved:
        core.engine.observe(new, home.home)
    replan(claims, home.home)
    if queued:
        core.queues.add(rec)
    else:
        gates.dirty = True
