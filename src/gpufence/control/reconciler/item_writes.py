"""Inbox items -> store writes + scheduler events (phase 1 of a reconciler cycle).

Each function writes inside the cycle's inbox transaction and records in ``Staged`` what must
happen in memory once that transaction has committed (``effects``: the reconciler's own
bookkeeping; ``replies``: answers to waiting API threads). Nothing here changes memory directly:
if the store refuses the transaction (disk full, read-only), the items are tried again later and
the reconciler is exactly as it was.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpufence.control.base.arrays import parse_array
from gpufence.control.base.config import core_tenant
from gpufence.control.base.executor import AttemptExit, Launch
from gpufence.control.base.jobspec import SubmitRequest, escape
from gpufence.control.base.logcap import read_record as read_logcap
from gpufence.control.base.member_records import logcap_file
from gpufence.control.base.record_reads import forget_spooled_exits
from gpufence.control.reconciler.context import submit_result
from gpufence.control.reconciler.inbox import (
    Ack,
    Cancel,
    CancelError,
    IdempotencyConflict,
    Live,
    NodeEvent,
    PendingCapReached,
    Staged,
    Submit,
    TenantRemoved,
)
from gpufence.control.reconciler.job_writes import insert_job, prepare, write_array
from gpufence.control.store import database as st
from gpufence.control.store.reserve import SpaceLow
from gpufence.model.decisions import Reason
from gpufence.model.events import (
    CheckpointAck,
    JobCancelled,
    JobFinished,
    JobLost,
    JobStopped,
    JobSubmitted,
    NodeDown,
    NodeUp,
    OutcomeKnown,
)
from gpufence.sched.jobs import JobState

if TYPE_CHECKING:
    from gpufence.control.reconciler.context import WriteContext
    from gpufence.control.reconciler.seam import JobTx


def spec_and_text(req: SubmitRequest) -> tuple[dict[str, Any], str]:
    """The spec as the store keeps it, and its canonical text."""
    spec = req.stored()
    return spec, st.spec_text(spec)


def stored_spec(req: SubmitRequest) -> tuple[dict[str, Any], str] | None:
    """``spec_and_text``, made on the submitting thread (``Submit.stored``: while the cycle
    waits for its batch, not in it); None where it raises: ``write_submit`` makes it again
    and refuses that request alone."""
    try:
        return spec_and_text(req)
    except Exception:
        return None


def write_submit(ctx: WriteContext, tx: JobTx, it: Submit, now: float, staged: Staged) -> None:
    req = it.req
    spec, text = it.stored or spec_and_text(req)
    # the key is bound to the id the job is about to get: nothing inserts a job in between,
    # and a request refused below is undone with its savepoint, key included
    claimed = tx.next_id()
    if it.key is not None:
        digest = st.request_hash(spec, text)
        if not tx.claim_key(it.tenant, it.key, claimed, digest, now):
            replay(ctx, tx, it, it.key, digest, staged)
            return
    # a request these raise on is undone with its savepoint (see Reconciler._inbox_tx)
    if ctx.config.accounts.is_removed(it.tenant):
        raise TenantRemoved(f"tenant {it.tenant} was removed by the admin")
    check_pending_cap(ctx, tx, it.tenant, req)
    full = tx.submit_refusal()
    if full is not None:
        raise SpaceLow(full)
    ready, known = prepare(ctx, tx, it.tenant, req)  # names, after_* -> ids (job_writes.py)
    staged.events += known
    if ready.array is not None:
        jid = write_array(ctx, tx, it, ready, now, staged)
    else:  # the spec and its text are reusable unless prepare rewrote the request
        jid = insert_job(
            ctx, tx, it.tenant, ready, now, staged, stored=(spec, text) if ready is req else None
        )
        staged.submits.append((jid, it.future))
    if jid != claimed:
        raise st.StoreError(f"job {jid} was inserted under another id than {claimed}")


def check_pending_cap(ctx: WriteContext, tx: JobTx, tenant: str, req: SubmitRequest) -> None:
    """``PendingCapReached`` if ``req`` (an array: all its tasks) would take ``tenant`` past its
    cap on pending jobs: each pending job is a row every restart reads back and a candidate
    every cycle weighs, so one tenant's flood must not become everyone's slow restart."""
    cap = ctx.config.pending_cap(tenant)
    if cap is None:
        return
    adding = len(parse_array(req.array)[0]) if req.array is not None else 1
    pending = tx.pending_count(tenant)
    if pending + adding > cap:
        what = f"{adding} more" if adding > 1 else "one more"
        raise PendingCapReached(
            f"tenant {tenant} has {pending} pending job(s); {what} would pass its cap of "
            f"{cap} (control.max_pending_jobs, or control.tenants.{tenant}.max_pending_jobs): "
            "wait for some to start, cancel some, submit a smaller array, or ask the admin "
            "to raise the cap"
        )


def replay(ctx: WriteContext, tx: JobTx, it: Submit, key: str, digest: str, staged: Staged) -> None:
    """An Idempotency-Key seen before: the job it created then, or 422 for another request."""
    seen = tx.idempotent(it.tenant, key)
    if seen is None:
        raise st.StoreError(f"Idempotency-Key {escape(key)} refused but not in the store")
    jid, was = seen
    if was != digest:
        conflict = IdempotencyConflict(
            "this Idempotency-Key was used for a different request "
            f"(job {jid}); use a new key for a new job"
        )
        staged.replies.append((it.future, conflict))
        return
    # the key stands for the job, or for an array's own id (an array an older version stored:
    # for its first task's id): the answer is its first task's, with the array's ids
    tasks = tx.array_tasks(jid)
    first = tasks[0] if tasks else jid
    row = tx.job(first)
    res = submit_result(ctx.scheduler, ctx.live, first, lambda _jid: row, replayed=True)
    array = jid if first != jid else ""
    staged.replies.append((it.future, replace(res, tasks=tasks, array=array)))


def write_cancel(ctx: WriteContext, tx: JobTx, it: Cancel, now: float, staged: Staged) -> None:
    core = ctx.scheduler.jobs().get(it.job_id)
    live = ctx.live.get(it.job_id)
    if live is not None:
        if live.cancel:
            staged.replies.append((it.future, st.STOPPING))
            return
        tx.set_job(it.job_id, cancel_requested=1, state=st.STOPPING, reason="cancelled")
        tx.log(now, it.job_id, "cancel", "", "stopping its processes")

        def mark(v: Live = live) -> None:
            v.cancel = True

        staged.effects.append(mark)
        staged.stops.append((it.job_id, live.attempt))
        staged.replies.append((it.future, st.STOPPING))
    elif core is not None and core.state is JobState.PENDING:
        staged.events.append(JobCancelled(it.job_id))
        tx.set_job(
            it.job_id, cancel_requested=1, state=st.CANCELLED, reason="cancelled", ended_at=now
        )
        tx.log(now, it.job_id, "cancel", "", "removed from its queue")
        staged.replies.append((it.future, st.CANCELLED))
    else:
        staged.replies.append((it.future, CancelError(f"job {it.job_id} has already ended")))


def write_observation(
    ctx: WriteContext, tx: JobTx, it: AttemptExit | Ack | NodeEvent, now: float, staged: Staged
) -> None:
    if isinstance(it, AttemptExit):
        write_exit(ctx, tx, it, now, staged)
    elif isinstance(it, Ack):
        live = ctx.live.get(it.job_id)
        if live is not None and live.attempt == it.attempt and not live.orphan:
            tx.log(now, it.job_id, "checkpoint-ack", "", f"attempt {it.attempt}")
            staged.events.append(CheckpointAck(it.job_id))
    else:  # the core stops (and requeues) what ran there
        tx.log(now, None, "node-up" if it.up else "node-down", "", escape(it.node))
        staged.events.append(NodeUp(it.node) if it.up else NodeDown(it.node))


def ended_time(tx: JobTx, ev: AttemptExit, now: float) -> float:
    """When the attempt ended: its launchers' record (an exit found only after a restart
    ended before it, and the GPUs were not used meanwhile), kept within [its start, now];
    ``now`` where unknown."""
    if ev.ended_at is None or ev.ended_at >= now:
        return now
    started = tx.job(ev.job_id).started_at
    return max(ev.ended_at, started) if started is not None else ev.ended_at


def write_exit(ctx: WriteContext, tx: JobTx, ev: AttemptExit, now: float, staged: Staged) -> None:
    live = ctx.live.get(ev.job_id)
    if live is None or live.attempt != ev.attempt:
        return  # a stale report (an earlier attempt, or a job already settled)
    jid = ev.job_id
    code = exit_code(ev.codes)
    end = ended_time(tx, ev, now)
    tx.set_attempt(jid, ev.attempt, state="exited", ended_at=end, exit_codes=list(ev.codes))
    msg = f"attempt {ev.attempt} exited with {list(ev.codes)}"
    tx.log(now, jid, "exited", "oom" if ev.oom else "", msg)
    strays = log_exit_notes(tx, ev, live.launch, now)
    staged.exits += 1

    def forget(v: Live = live) -> None:
        if ctx.live.get(jid) is v:
            del ctx.live[jid]
        ctx.telemetry.released(v.launch)
        # persisted now: a record the launcher had to spool is no longer needed
        forget_spooled_exits(v.launch.attempt_dir, len(v.launch.members))

    staged.effects.append(forget)
    if live.orphan:
        settle_orphan(tx, live, jid, ev, now, staged)
        ended = tx.job(jid).state
        if ended in st.TERMINAL:  # the core never tracked it: its dependents need the outcome
            staged.events.append(OutcomeKnown(jid, ended))
        return
    lost = bool(ev.codes) and any(c is None for c in ev.codes)
    if live.cancel:
        staged.events.append(JobCancelled(jid))
        tx.set_job(jid, state=st.CANCELLED, ended_at=end, exit_code=code)
    elif lost and not live.stopping and live.attempt < live.spec.max_attempts:
        # its launcher died before it could record the job's exit (the executor says None):
        # the outcome is unknown, as for an attempt lost while the control plane was down
        why = f"attempt {ev.attempt} lost: its launcher died without the job's exit"
        tx.log(now, jid, "lost", "lost", why)
        staged.events.append(JobLost(jid, why))
    elif lost and not live.stopping:
        staged.events.append(JobFinished(jid, False))
        why = f"attempt {live.attempt} lost and max_attempts ({live.spec.max_attempts}) used"
        tx.set_job(jid, state=st.FAILED, ended_at=end, reason="lost", message=why)
    elif live.stopping and not finished_first(ev):
        staged.events.append(JobStopped(jid))  # the core requeues it or ends it
        tx.set_job(jid, exit_code=code)
    else:  # also a stop decided that no member's command lived to get: every one exited 0
        # on its own first (the work is done; one that exits 0 on the stop's SIGTERM is
        # requeued above)
        core = ctx.scheduler.jobs().get(jid)
        notice = core.notice if core is not None else None
        if not ev.succeeded and notice is not None and notice.reason is not Reason.IDLE:
            # it went down during a notice (e.g. killed by the notice signal): the core takes
            # that as a stop it did itself and decides it (Stop, then Requeue unless a time
            # limit), so the store follows those decisions instead of ending the job here
            staged.events.append(JobFinished(jid, False))
            tx.set_job(jid, exit_code=code)
            return
        write_finished(tx, live, ev, end, (msg, strays), staged)


def write_finished(
    tx: JobTx, live: Live, ev: AttemptExit, end: float, notes: tuple[str, str], staged: Staged
) -> None:
    """The attempt's commands ended on their own: the job is done, or failed with why.
    ``notes``: the exit line and the strays note (empty when none were killed)."""
    jid = ev.job_id
    msg, strays = notes
    code = exit_code(ev.codes)
    staged.events.append(JobFinished(jid, ev.succeeded))
    if live.stopping and ev.succeeded:
        not_stopped(tx, jid, ev.attempt)
    if ev.succeeded:
        tx.set_job(jid, state=st.DONE, ended_at=end, exit_code=code, reason="", message=strays)
    elif ev.codes:
        reason, msg = failure(ev, live, msg)
        tx.set_job(
            jid,
            state=st.FAILED,
            ended_at=end,
            exit_code=code,
            reason=reason,
            message="; ".join(x for x in (msg, strays) if x),
        )
    else:  # never started (launch or device error): keep the message that says why
        tx.set_job(jid, state=st.FAILED, ended_at=end)


def settle_orphan(
    tx: JobTx, live: Live, jid: str, ev: AttemptExit, now: float, staged: Staged
) -> None:
    """An attempt that ended while the control plane was down (see recovery.py), or one whose
    processes were killed before anything else ran on its GPUs (a half-spawned gang, a member
    whose launcher died): not in the scheduler, settled here."""
    lost = any(c is None for c in ev.codes)
    end = ended_time(tx, ev, now)
    code = exit_code(ev.codes)
    done_first = ev.succeeded and ev.stop_reached is False  # its work was done: never rerun
    if live.cancel:
        tx.set_job(jid, state=st.CANCELLED, ended_at=end, exit_code=code)
    elif done_first:
        not_stopped(tx, jid, ev.attempt)
        tx.set_job(jid, state=st.DONE, ended_at=end, exit_code=code)
    elif (lost or (live.stopping and live.requeue)) and live.attempt < live.spec.max_attempts:
        why = "lost while the control plane was down" if lost else "stopped for requeue"
        tx.set_job(jid, state=st.PENDING, attempt=live.attempt + 1, started_at=None)
        tx.log(now, jid, "requeued", "recovery", f"attempt {live.attempt} {why}")
        staged.events.append(JobSubmitted(live.spec.to_job(jid, now, core_tenant(live.tenant))))
    elif lost:
        why = f"attempt {live.attempt} lost and max_attempts ({live.spec.max_attempts}) used"
        tx.set_job(jid, state=st.FAILED, ended_at=end, reason="lost", message=why)
    elif live.stopping:
        tx.set_job(jid, state=st.FAILED, ended_at=end, exit_code=code)
    elif ev.succeeded:
        tx.set_job(jid, state=st.DONE, ended_at=end, exit_code=code)
    else:
        reason, msg = failure(ev, live, f"attempt {ev.attempt} exited with {list(ev.codes)}")
        tx.set_job(jid, state=st.FAILED, ended_at=end, exit_code=code, reason=reason, message=msg)


def not_stopped(tx: JobTx, jid: str, attempt: int) -> None:
    """The stop decided for this attempt ended none of it (``finished_first``): it is not
    counted as stopped (accounting's ``preemptions``); the stop's event stays in the log."""
    tx.set_attempt(jid, attempt, stop_reason=None, requeue=False)


def finished_first(ev: AttemptExit) -> bool:
    """Every member exited 0 before a stop could end it. The launchers' records say so where
    they tell (``stop_reached`` False; True: a stop reached one, also one sent by the control
    plane before a restart, which this executor has not asked again yet); where they do not,
    the stop was not yet asked of this executor (``stopped`` False). Its work is done: it is
    never run again."""
    if not ev.succeeded:
        return False
    return ev.stop_reached is False or (ev.stop_reached is None and not ev.stopped)


def exit_code(codes: tuple[int | None, ...]) -> int | None:
    known = [c for c in codes if c is not None]
    bad = [c for c in known if c != 0]
    return bad[0] if bad else (0 if known and len(known) == len(codes) else None)


def log_exit_notes(tx: JobTx, ev: AttemptExit, launch: Launch, now: float) -> str:
    """The events beside an exit: strays killed, logs cut at their limit; the strays' note."""
    strays = strays_note(ev)
    if strays:
        tx.log(now, ev.job_id, "strays-killed", "", strays)
    cut = logs_cut_note(launch)
    if cut:
        tx.log(now, ev.job_id, "log-limit", "log-limit", cut)
    return strays


def logs_cut_note(launch: Launch) -> str:
    """The job's ``log-limit`` event: which members' logs their launchers cut (``logcap.py``)."""
    cut = [
        (m.rank, found)
        for m in launch.members
        if (found := read_logcap(logcap_file(launch.attempt_dir, m.rank))) is not None
    ]
    if not cut:
        return ""
    ranks = ", ".join(f"rank {r}: {dropped} bytes cut" for r, (_, dropped) in cut)
    return (
        f"output passed the log limit of {cut[0][1][0]} bytes per log ({ranks}); each log keeps "
        "its first half, a note and the newest output (submit with --log-limit up to the "
        "partition's log_limit_mib to keep more)"
    )


def strays_note(ev: AttemptExit) -> str:
    """What status and events say of processes a job left behind (killed by the executor)."""
    return f"stray processes killed: {ev.strays_killed}" if ev.strays_killed else ""


def failure(ev: AttemptExit, live: Live, msg: str) -> tuple[str, str]:
    """(reason, message) of an attempt that failed on its own: ``oom`` when the executor saw
    the memory limit's OOM killer end a member, else ``exit-code``."""
    if not ev.oom:
        return "exit-code", msg
    limit = live.launch.limits.mem_bytes
    over = f" (over its memory limit of {limit / (1 << 20):g} MiB)" if limit else ""
    return "oom", f"attempt {ev.attempt}: killed by the out-of-memory killer{over}; {msg}"
