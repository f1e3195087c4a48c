"""Phase 1 of a cycle: apply what the front end observed (submits, ends, stops, acks, activity,
node and MIG changes, restores, holds, updates) to the job book, the queues and the ledger;
and phase 4, ``open_gates``: held, dependent and capped jobs that may run now join their
queues (gates.py).

Submission checks live in ``sched/intake.py``; a restart's restores in ``sched/restore.py``;
changes after submit (``JobUpdated``) in ``sched/update.py``.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufence.model.decisions import Cancel, Decision, NoticeWithdrawn, Reason, Reject, Requeue
from gpufence.model.events import (
    Activity,
    CheckpointAck,
    CheckpointWritten,
    DefragsRestored,
    Event,
    JobCancelled,
    JobFinished,
    JobHeld,
    JobLost,
    JobReleased,
    JobRestored,
    JobStopped,
    JobSubmitted,
    JobUpdated,
    MaintenanceCancelled,
    MaintenanceScheduled,
    MigLayoutRead,
    MigReconfigured,
    NodeDown,
    NodeDrained,
    NodeUndrained,
    NodeUp,
    OutcomeKnown,
    PreemptionsRestored,
    QueueRetuned,
    TenantsChanged,
    Tick,
    UsageRestored,
)
from gpufence.model.lifecycle import after_stop
from gpufence.sched.book import JobBook
from gpufence.sched.context import Claims, Core
from gpufence.sched.drains import apply_closure
from gpufence.sched.gates import Gates
from gpufence.sched.intake import Refused, resolve
from gpufence.sched.jobs import TERMINAL, JobRecord, JobState
from gpufence.sched.migdyn import MigWork, apply_layout_read
from gpufence.sched.protect import ProtectionState
from gpufence.sched.reasons import PendingReasons
from gpufence.sched.reclaim import track
from gpufence.sched.restore import restore
from gpufence.sched.retune import change_tenants, retune_queue
from gpufence.sched.update import apply_update, replan


def apply_events(
    core: Core,
    book: JobBook,
    claims: Claims,
    reasons: PendingReasons,
    mig: MigWork,
    gates: Gates,
    events: Iterable[Event],
    out: list[Decision],
    protection: ProtectionState | None = None,
) -> None:
    """Apply ``events`` in order; their decisions go to ``out`` as they are made."""
    for ev in events:
        _apply(core, book, claims, reasons, mig, gates, ev, out, protection)


def open_gates(
    core: Core, book: JobBook, claims: Claims, reasons: PendingReasons, gates: Gates
) -> list[Decision]:
    """Phase 4: gated jobs that may run now join their queues; one whose dependency can never
    be met is cancelled, which may doom its own dependents: judged again until none is."""
    out: list[Decision] = []
    while nevers := gates.advance(core, book):
        for never in nevers:
            _end(core, book, claims, reasons, gates, book.records[never.job_id], JobState.CANCELLED)
            out.append(Cancel(never.job_id, Reason.DEPENDENCY, never.message))
    return out


def _finished(
    core: Core,
    book: JobBook,
    claims: Claims,
    reasons: PendingReasons,
    gates: Gates,
    rec: JobRecord,
    succeeded: bool,
    out: list[Decision],
) -> None:
    """A job's process ended by itself (``JobFinished``)."""
    if rec.state is JobState.PENDING:
        return  # a late report from an earlier attempt: the requeued job lives on
    n = rec.notice
    if not succeeded and n is not None and n.reason is not Reason.IDLE:
        # it was asked to wrap up and went down doing so (e.g. killed by the notice
        # signal before it could handle it): a stop it did itself, so it is requeued
        # like any preempted job instead of failing for the scheduler's own action
        # (a time limit's notice ends the job all the same: it is not requeued)
        requeue = n.reason is not Reason.TIME_LIMIT
        out.append(book.stop(rec, n.reason, requeue, "exited during its notice", core.now))
        _stopped(core, book, gates, rec, out)
        return
    state = JobState.DONE if succeeded else JobState.FAILED
    _end(core, book, claims, reasons, gates, rec, state)


# what the front end reports about one job it runs (or was told to run)
_JOB_REPORTS = (
    JobFinished,
    JobStopped,
    JobLost,
    JobCancelled,
    CheckpointAck,
    CheckpointWritten,
    Activity,
)


def _apply(
    core: Core,
    book: JobBook,
    claims: Claims,
    reasons: PendingReasons,
    mig: MigWork,
    gates: Gates,
    ev: Event,
    out: list[Decision],
    protection: ProtectionState | None,
) -> None:
    # (the kinds are disjoint: the most frequent are tested first)
    if isinstance(ev, _JOB_REPORTS):
        rec = book.records.get(ev.job_id)
        if rec is None or rec.state in TERMINAL:
            return  # late report about a job we no longer track: nothing to do
        _job_event(core, book, claims, reasons, gates, rec, ev, out)
    elif isinstance(ev, JobSubmitted):
        _submit(core, book, gates, ev, out)
    elif not _restored(core, book, gates, mig, ev, protection) and not _gate_event(
        core, book, claims, reasons, gates, ev, out
    ):
        _cluster_event(core, book, mig, ev, out)


def _restored(
    core: Core,
    book: JobBook,
    gates: Gates,
    mig: MigWork,
    ev: Event,
    protection: ProtectionState | None,
) -> bool:
    """What a front end restores after a restart (a job, fair-share usage, protection's and
    MIG defrag's budget windows); False for any other event."""
    if isinstance(ev, JobRestored):
        restore(core, book, ev)
        if ev.job.id in book.records:  # gates: a running array task fills a slot of its cap
            gates.restored(book.records[ev.job.id])
    elif isinstance(ev, UsageRestored):
        core.fairshare.restore(dict(ev.usage), ev.at, core.now)
    elif isinstance(ev, PreemptionsRestored):  # protection's own state (None: no protection)
        if protection is not None:
            protection.restore(ev.times, core.now)
    elif isinstance(ev, DefragsRestored):
        mig.defrag.restore(ev.times, core.now)
    else:
        return False
    return True


def _gate_event(
    core: Core,
    book: JobBook,
    claims: Claims,
    reasons: PendingReasons,
    gates: Gates,
    ev: Event,
    out: list[Decision],
) -> bool:
    """Holds, releases, updates after submit and known outcomes (the gates'); False for any
    other event."""
    if isinstance(ev, JobHeld):
        gates.hold(core, book, claims, reasons, ev.job_id, ev.by)
    elif isinstance(ev, JobUpdated):
        apply_update(core, book, claims, reasons, gates, ev, out)
    elif isinstance(ev, JobReleased):
        if gates.release(ev.job_id):
            replan(claims, book.records[ev.job_id].home)
    elif isinstance(ev, OutcomeKnown):
        gates.outcome(ev.job_id, ev.state)
    else:
        return False
    return True


def _cluster_event(core: Core, book: JobBook, mig: MigWork, ev: Event, out: list[Decision]) -> bool:
    """The clock, nodes (health, drains, maintenance), MIG layouts, queues and tenants changed
    at run time; False for any other event."""
    if isinstance(ev, NodeUp | NodeDown):  # a cordon (stop_jobs False) keeps what runs
        stop = isinstance(ev, NodeDown) and ev.stop_jobs
        _node(core, book, ev.node, isinstance(ev, NodeUp), out, stop_jobs=stop)
    elif isinstance(ev, NodeDrained | NodeUndrained | MaintenanceScheduled | MaintenanceCancelled):
        apply_closure(core, book, ev, out)
    elif isinstance(ev, MigReconfigured):
        mig.reconfigured(core, ev.gpu)
    elif isinstance(ev, MigLayoutRead):
        apply_layout_read(core, mig, ev)
    elif isinstance(ev, QueueRetuned):
        retune_queue(core, ev)
    elif isinstance(ev, TenantsChanged):
        change_tenants(core, ev)
    elif not isinstance(ev, Tick):
        return False
    return True


def _job_event(
    core: Core,
    book: JobBook,
    claims: Claims,
    reasons: PendingReasons,
    gates: Gates,
    rec: JobRecord,
    ev: Event,
    out: list[Decision],
) -> None:
    """A report about a job the scheduler tracks and that has not ended."""
    now = core.now
    if isinstance(ev, JobFinished):
        _finished(core, book, claims, reasons, gates, rec, ev.succeeded, out)
    elif isinstance(ev, JobStopped):
        _stopped(core, book, gates, rec, out)
    elif isinstance(ev, JobLost):
        if rec.state is JobState.RUNNING:  # (stopping already: that stop says what comes next)
            why = ev.message or "its processes were lost"
            out.append(book.stop(rec, Reason.LOST, True, why, now))
        _stopped(core, book, gates, rec, out)  # (pending: a late report; nothing to do)
    elif isinstance(ev, JobCancelled):
        _end(core, book, claims, reasons, gates, rec, JobState.CANCELLED)
    elif isinstance(ev, CheckpointAck):
        rec.last_checkpoint = now
        n = rec.notice
        if n is not None and n.reason is not Reason.IDLE:
            requeue = n.reason is not Reason.TIME_LIMIT  # a time limit ends the job
            out.append(book.stop(rec, n.reason, requeue, "checkpoint acknowledged", now))
    elif isinstance(ev, CheckpointWritten):
        rec.last_checkpoint = now
    elif isinstance(ev, Activity):
        _activity(core, book, rec, ev.utilization, out)


def _submit(core: Core, book: JobBook, gates: Gates, ev: JobSubmitted, out: list[Decision]) -> None:
    job = ev.job
    if job.id in book.records:
        out.append(Reject(job.id, Reason.DUPLICATE, f"job id {job.id} already used"))
        book.counters.rejects += 1
        return
    got = resolve(core.cluster, job, core.ledger.mig, core.tenants)
    if isinstance(got, Refused):
        book.records[job.id] = JobRecord(job, "", "", JobState.REJECTED)
        out.append(Reject(job.id, got.reason, got.message))
        book.counters.rejects += 1
        return
    rec = JobRecord(job, got.home, got.queue)
    book.records[job.id] = rec
    if gates.admit(rec):  # gates: held / dependent / capped jobs wait outside the queues
        core.queues.add(rec)
    core.engine.observe(job, got.home)


def _end(
    core: Core,
    book: JobBook,
    claims: Claims,
    reasons: PendingReasons,
    gates: Gates,
    rec: JobRecord,
    state: JobState,
) -> None:
    gated = gates.ended(rec)  # gates: dependents and the array cap see it end
    if rec.state is JobState.PENDING:
        if not gated:
            core.queues.remove(rec.job.id)
        reasons.forget(rec.job.id)
        claims.nominations.pop(rec.job.id, None)
    else:
        book.release(core, rec)
    book.move(rec, state)


def _stopped(core: Core, book: JobBook, gates: Gates, rec: JobRecord, out: list[Decision]) -> None:
    if rec.state is JobState.PENDING:
        return
    if rec.state is JobState.RUNNING:
        # reported stopped, but no Stop decision asked it to: it failed silently, with nothing
        # in the log. Its outcome is unknown, as when its processes are lost (JobLost)
        why = "reported stopped, but no stop was decided for it: its outcome is unknown"
        out.append(book.stop(rec, Reason.LOST, True, why, core.now))
    book.release(core, rec)
    if rec.requeue_on_stop:
        rec.attempt += 1
        book.move(rec, JobState.PENDING)
        rec.started_at = None
        rec.arrival = 0  # back in its queue as a new arrival, behind jobs of its submit time
        core.queues.add(rec)
        book.counters.requeues += 1
        reason = rec.stop_reason or Reason.QUEUED
        out.append(Requeue(rec.job.id, reason, rec.attempt, "back in its queue"))
    else:
        book.move(rec, after_stop(rec.stop_reason or Reason.QUEUED, requeue=False))
        gates.ended(rec)  # gates


def _activity(
    core: Core, book: JobBook, rec: JobRecord, utilization: float, out: list[Decision]
) -> None:
    pol = core.cluster.partitions[rec.home].reclaim if rec.home else None
    threshold = pol.idle_threshold if pol is not None else 0.0
    if utilization < threshold:
        return
    rec.last_active = core.now
    if rec.notice is not None and rec.notice.reason is Reason.IDLE:
        book.withdraw(rec)
        out.append(NoticeWithdrawn(rec.job.id, Reason.ACTIVE_AGAIN, "session active again"))
    if rec.job.id in book.interactive:
        track(core.cluster, book, rec)


def _node(
    core: Core, book: JobBook, name: str, up: bool, out: list[Decision], *, stop_jobs: bool = True
) -> None:
    idx = core.cluster.node_by_name.get(name)
    if idx is None:
        return
    # health is one of three things a node needs to take work (a drain or a maintenance window
    # may keep it closed after it comes back: state/closures.py)
    if up:
        core.closures.down.discard(idx)
    else:
        core.closures.down.add(idx)
    core.closures.sync(core.ledger, (idx,))
    if up or not stop_jobs:
        return
    # (also when it was already down: a cordoned node that then fails stops its jobs)
    for jid in core.ledger.jobs_on_node(idx):
        rec = book.records[jid]
        if rec.state is JobState.RUNNING:
            out.append(book.stop(rec, Reason.NODE_FAILURE, True, f"node {name} failed", core.now))
