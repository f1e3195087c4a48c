"""Phase 1 of a cycle: apply what the front end observed (submits, ends, stops, acks, activity,
node and MIG changes, restores) to the job book, the queues and the ledger.

Submission checks live in ``sched/intake.py``; a restart's restores in ``sched/restore.py``.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufence.model.decisions import Decision, NoticeWithdrawn, Reason, Reject, Requeue
from gpufence.model.events import (
    Activity,
    CheckpointAck,
    CheckpointWritten,
    Event,
    JobCancelled,
    JobFinished,
    JobRestored,
    JobStopped,
    JobSubmitted,
    MigLayoutRead,
    MigReconfigured,
    NodeDown,
    NodeUp,
    Tick,
    UsageRestored,
)
from gpufence.model.lifecycle import after_stop
from gpufence.sched.book import JobBook
from gpufence.sched.context import Claims, Core
from gpufence.sched.intake import Refused, resolve
from gpufence.sched.jobs import TERMINAL, JobRecord, JobState
from gpufence.sched.migdyn import MigWork, apply_layout_read
from gpufence.sched.reasons import PendingReasons
from gpufence.sched.reclaim import track
from gpufence.sched.restore import restore


def apply_events(
    core: Core,
    book: JobBook,
    claims: Claims,
    reasons: PendingReasons,
    mig: MigWork,
    events: Iterable[Event],
    out: list[Decision],
) -> None:
    """Apply ``events`` in order; their decisions go to ``out`` as they are made."""
    for ev in events:
        _apply(core, book, claims, reasons, mig, ev, out)


def _apply(
    core: Core,
    book: JobBook,
    claims: Claims,
    reasons: PendingReasons,
    mig: MigWork,
    ev: Event,
    out: list[Decision],
) -> None:
    if isinstance(ev, JobSubmitted):
        _submit(core, book, ev, out)
        return
    if isinstance(ev, Tick):
        return
    if isinstance(ev, JobRestored):
        restore(core, book, ev)
        return
    if isinstance(ev, UsageRestored):
        core.fairshare.restore(dict(ev.usage), ev.at, core.now)
        return
    if isinstance(ev, NodeDown | NodeUp):
        _node(core, book, ev.node, isinstance(ev, NodeUp), out)
        return
    if isinstance(ev, MigReconfigured):
        mig.reconfigured(core, ev.gpu)
        return
    if isinstance(ev, MigLayoutRead):
        apply_layout_read(core, mig, ev)
        return
    rec = book.records.get(ev.job_id)
    if rec is None or rec.state in TERMINAL:
        return  # late report about a job we no longer track: nothing to do
    now = core.now
    if isinstance(ev, JobFinished):
        if rec.state is JobState.PENDING:
            return  # a late report from an earlier attempt: the requeued job lives on
        n = rec.notice
        if not ev.succeeded and n is not None and n.reason is not Reason.IDLE:
            # it was asked to wrap up and went down doing so (e.g. killed by the notice
            # signal before it could handle it): a stop it did itself, so it is requeued
            # like any preempted job instead of failing for the scheduler's own action
            # (a time limit's notice ends the job all the same: it is not requeued)
            requeue = n.reason is not Reason.TIME_LIMIT
            out.append(book.stop(rec, n.reason, requeue, "exited during its notice", now))
            _stopped(core, book, rec, out)
            return
        _end(core, book, claims, reasons, rec, JobState.DONE if ev.succeeded else JobState.FAILED)
    elif isinstance(ev, JobStopped):
        _stopped(core, book, rec, out)
    elif isinstance(ev, JobCancelled):
        _end(core, book, claims, reasons, rec, JobState.CANCELLED)
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


def _submit(core: Core, book: JobBook, ev: JobSubmitted, out: list[Decision]) -> None:
    job = ev.job
    if job.id in book.records:
        out.append(Reject(job.id, Reason.DUPLICATE, f"job id {job.id} already used"))
        book.counters.rejects += 1
        return
    got = resolve(core.cluster, job, core.ledger.mig)
    if isinstance(got, Refused):
        book.records[job.id] = JobRecord(job, "", "", JobState.REJECTED)
        out.append(Reject(job.id, got.reason, got.message))
        book.counters.rejects += 1
        return
    rec = JobRecord(job, got.home, got.queue)
    book.records[job.id] = rec
    core.queues.add(rec)
    core.engine.observe(job, got.home)


def _end(
    core: Core,
    book: JobBook,
    claims: Claims,
    reasons: PendingReasons,
    rec: JobRecord,
    state: JobState,
) -> None:
    if rec.state is JobState.PENDING:
        core.queues.remove(rec.job.id)
        reasons.forget(rec.job.id)
        claims.nominations.pop(rec.job.id, None)
    else:
        book.release(core, rec)
    book.move(rec, state)


def _stopped(core: Core, book: JobBook, rec: JobRecord, out: list[Decision]) -> None:
    if rec.state is JobState.PENDING:
        return
    book.release(core, rec)
    if rec.requeue_on_stop:
        rec.attempt += 1
        book.move(rec, JobState.PENDING)
        rec.started_at = None
        core.queues.add(rec)
        book.counters.requeues += 1
        reason = rec.stop_reason or Reason.QUEUED
        out.append(Requeue(rec.job.id, reason, rec.attempt, "back in its queue"))
    else:
        book.move(rec, after_stop(rec.stop_reason or Reason.QUEUED, requeue=False))


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


def _node(core: Core, book: JobBook, name: str, up: bool, out: list[Decision]) -> None:
    idx = core.cluster.node_by_name.get(name)
    if idx is None or core.ledger.node_up[idx] == up:
        return
    core.ledger.set_node_up(idx, up)
    if up:
        return
    for jid in core.ledger.jobs_on_node(idx):
        rec = book.records[jid]
        if rec.state is JobState.RUNNING:
            out.append(book.stop(rec, Reason.NODE_FAILURE, True, f"node {name} failed", core.now))
