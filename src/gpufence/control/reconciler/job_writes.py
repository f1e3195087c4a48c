"""The store side of names, dependencies, arrays and hold/release (issue 15).

``prepare`` runs inside the inbox transaction, before a submit is inserted: it checks the job's
name (unique per tenant among jobs not ended), resolves ``after_*`` references (ids or names) to
ids — a reference to no job of the tenant is a 422 naming the field — and tells the core how
parents it no longer tracks ended (``OutcomeKnown``: they finished before a restart).
``write_array`` inserts one job per index of an array. ``write_action`` holds or releases a
pending job (or hands an update to ``update_writes``); ``write_cancel_decision`` persists a
dependent the core cancelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpufence.control.base.arrays import parse_array
from gpufence.control.base.config import ADMIN, core_tenant
from gpufence.control.base.jobspec import MAX_DEPENDENCIES, ArrayTask, SubmitRequest, escape
from gpufence.control.reconciler.inbox import (
    Action,
    CancelError,
    Home,
    InvalidField,
    NotPermitted,
    Staged,
    Submit,
    SubmitResult,
    reply,
)
from gpufence.control.reconciler.update_writes import write_update
from gpufence.control.store import database as st
from gpufence.control.store import names as job_names
from gpufence.model.decisions import Cancel
from gpufence.model.events import Event, JobHeld, JobReleased, JobSubmitted, OutcomeKnown
from gpufence.model.job import Job, RequestKind
from gpufence.sched.intake import Accepted, resolve
from gpufence.sched.jobs import JobState

if TYPE_CHECKING:
    from gpufence.control.reconciler.context import WriteContext
    from gpufence.control.reconciler.seam import JobTx

DEPENDENCY_FIELDS = ("after_ok", "after_any", "after_not_ok")
_DONE = {"hold": "held", "release": "released"}


def prepare(
    ctx: WriteContext, tx: JobTx, tenant: str, req: SubmitRequest
) -> tuple[SubmitRequest, list[Event]]:
    """``req`` with its dependencies as ids, and what the core must learn first."""
    if req.array_task is not None:
        raise InvalidField(("body", "array_task"), "is set by gpufence; submit with 'array'")
    if req.name is not None:
        check_name(tx, tenant, req)
    if not (req.after_ok or req.after_any or req.after_not_ok):
        return req, []  # the common case stays as cheap as it was (the submit hot path)
    known: list[Event] = []
    core = ctx.scheduler.jobs()
    update = {
        field: dependency_ids(tx, tenant, field, getattr(req, field), core, known)
        for field in DEPENDENCY_FIELDS
    }
    return req.model_copy(update=update), known


def check_name(tx: JobTx, tenant: str, req: SubmitRequest) -> None:
    """A job name must be one and must not be taken by a job of ``tenant`` that has not ended."""
    assert req.name is not None
    problem = job_names.name_problem(req.name)
    if problem is not None:
        raise InvalidField(("body", "name"), problem)
    serving = str(req.workload_class) == "serving"  # replicas of one deployment share it
    holder = tx.live_holder(tenant, req.name, serving)
    if holder is not None:
        raise InvalidField(
            ("body", "name"),
            f"'{req.name}' is the name of {holder.id} ({holder.state}); names are unique "
            "per tenant among jobs that have not ended (serving replicas of one "
            "deployment excepted): pick another name, or cancel "
            f"{holder.id} first",
        )


def dependency_ids(
    tx: JobTx,
    tenant: str,
    field: str,
    refs: list[str],
    core: Mapping[str, object],
    known: list[Event],
) -> list[str]:
    """The ids the references (ids or names) of one dependency field denote; the outcome of
    each that ended and that the core does not know is added to ``known``."""
    ids: list[str] = []
    seen: set[str] = set()  # a set: a name can expand to a 10,000-task array
    for ref in refs:
        try:
            found = tx.resolve_ref(tenant, ref)
        except job_names.UnknownJob as exc:
            raise InvalidField(("body", field), f"{exc} among the jobs of {tenant}") from None
        for n in found:
            if n.id in seen:
                continue
            seen.add(n.id)
            ids.append(n.id)
            if n.id not in core and n.state in st.TERMINAL:
                known.append(OutcomeKnown(n.id, n.state))
        if len(ids) > MAX_DEPENDENCIES:
            # refused here: stored longer, the spec would fail its own check at launch
            # and at the next start (the job accepted, then failed as 'invalid')
            raise InvalidField(
                ("body", field),
                f"'{escape(ref)}' brings the jobs it names to more than {MAX_DEPENDENCIES} "
                "(an array counts each task): depend on fewer jobs, or on one job that "
                "itself waits for the array",
            )
    return ids


def write_array(
    ctx: WriteContext, tx: JobTx, it: Submit, req: SubmitRequest, now: float, staged: Staged
) -> str:
    """Insert every task of ``req.array`` under an id of the array's own, taken from the job
    sequence right before its tasks (as Slurm's array job id: a dependency on it, a cancel,
    hold or release of it is one on every task; ``names.array_of``). Returns the array's id.
    The client's future gets the first task's answer with the array's id and every task's."""
    assert req.array is not None
    indices, cap = parse_array(req.array)
    array = tx.next_id(reserve=True)
    ids = [
        insert_job(
            ctx,
            tx,
            it.tenant,
            req.model_copy(update={"array_task": ArrayTask(job=array, index=i, cap=cap)}),
            now,
            staged,
        )
        for i in indices
    ]
    what = f"array {array}: {len(ids)} task(s) {ids[0]}..{ids[-1]}, cap {cap or '-'}"
    tx.log(now, ids[0], "array", "", what)
    first_answer: Future[SubmitResult] = Future()
    staged.submits.append((ids[0], first_answer))
    for jid in ids[1:]:
        staged.submits.append((jid, Future()))
    user = it.future
    tasks = tuple(ids)

    def answer(f: Future[SubmitResult]) -> None:
        exc = f.exception()  # through reply: a caller that gave up has cancelled its future
        reply(user, exc if exc is not None else replace(f.result(), tasks=tasks, array=array))

    first_answer.add_done_callback(answer)
    return array


def insert_job(
    ctx: WriteContext,
    tx: JobTx,
    tenant: str,
    req: SubmitRequest,
    now: float,
    staged: Staged,
    defer_event: bool = False,
    stored: tuple[dict[str, Any], str] | None = None,
) -> str:
    """One new pending job in the store, and (unless ``defer_event``) its ``JobSubmitted``;
    ``stored``: ``req.stored()`` and its ``spec_text`` if the caller has them.

    The row gets the partition and queue the core will give the job, predicted with the
    core's own ``resolve`` on the same cluster and ledger: the decisions transaction then
    rewrites only the homes the prediction got wrong (``Reconciler._save``), not every new
    row (an UPDATE of each job's row and indexes, as costly as its insert)."""
    jid = tx.next_id()
    job = req.to_job(jid, now, core_tenant(tenant), held_by=tenant)
    asked = (req.partition, req.queue)
    home = predicted_home(ctx, job)
    what = job.request.describe()
    spec, text = stored if stored is not None else (req.stored(), None)
    added = tx.add_job(
        tenant=tenant,
        spec=spec,
        workload_class=str(req.workload_class),
        partition=home[0],
        queue=home[1],
        submitted_at=now,
        gpus=f"{req.replicas}x {what}" if req.replicas != 1 else what,
        text=text,
    )
    assert added == jid
    staged.homes.append(Home(jid, home, asked))
    if req.hold:
        tx.set_job(jid, held=1, held_by=tenant)
    tx.log(now, jid, "submitted", "", f"by {tenant}: {what}")
    if not defer_event:
        staged.events.append(JobSubmitted(job))
    staged.effects.append(ctx.telemetry.submitted_counter(str(req.workload_class)).inc)
    return jid


HOMES_SEEN_MAX = 1024


def predicted_home(ctx: WriteContext, job: Job) -> tuple[str, str]:
    """(partition, queue) the core's ``resolve`` gives ``job`` (or what it asked for, if it
    refuses it), remembered per kind of request: jobs of one shape and tenant asking for the
    same partition and queue go to the same home. A MIG request is resolved each time (a static
    layout read off the devices can change its answer); a wrong guess costs a rewrite."""
    mig = job.request.kind is RequestKind.MIG
    key = (job.partition, job.queue, job.tenant, job.shape())
    home = None if mig else ctx.homes_seen.get(key)
    if home is not None:
        return home
    got = resolve(
        ctx.scheduler.cluster, job, ctx.scheduler.ledger.mig, ctx.scheduler.config.tenants
    )
    if not isinstance(got, Accepted):
        return (job.partition, job.queue)
    home = (got.home, got.queue)
    if not mig:
        if len(ctx.homes_seen) >= HOMES_SEEN_MAX:
            ctx.homes_seen.clear()
        ctx.homes_seen[key] = home
    return home


def write_action(ctx: WriteContext, tx: JobTx, it: Action, now: float, staged: Staged) -> None:
    if it.kind == "update":
        write_update(ctx, tx, it, now, staged)
        return
    core = ctx.scheduler.jobs().get(it.job_id)
    row = tx.job(it.job_id)
    if core is None or core.state is not JobState.PENDING or row.state != st.PENDING:
        fix = (
            "; a running job keeps its GPUs until it ends: cancel it, or lower its time "
            f"limit (gpufence update {it.job_id} --time-limit ...)"
            if row.state in (st.STARTING, st.RUNNING)
            else ""
        )
        only = f"only pending jobs can be {_DONE[it.kind]}"
        staged.replies.append(
            (it.future, CancelError(f"job {it.job_id} is {row.state}: {only}{fix}"))
        )
        return
    by = it.by or ADMIN
    if it.kind == "hold":
        if not row.held:
            tx.set_job(it.job_id, held=1, held_by=by)
            tx.log(now, it.job_id, "hold", "held", f"held by {by}")
            staged.events.append(JobHeld(it.job_id, by))
        staged.replies.append((it.future, st.PENDING))
        return
    if not row.held:
        staged.replies.append((it.future, CancelError(f"job {it.job_id} is not held")))
        return
    if row.held_by == ADMIN and by != ADMIN:  # as Slurm's admin hold: the admin releases it
        refusal = NotPermitted(f"job {it.job_id} was held by the admin: only the admin releases it")
        staged.replies.append((it.future, refusal))
        return
    tx.set_job(it.job_id, held=0, held_by="")
    tx.log(now, it.job_id, "release", "", f"released by {by}")
    staged.events.append(JobReleased(it.job_id))
    staged.replies.append((it.future, st.PENDING))


def write_cancel_decision(tx: JobTx, d: Cancel, now: float) -> None:
    tx.set_job(d.job_id, state=st.CANCELLED, reason=str(d.reason), message=d.message, ended_at=now)
    tx.log(now, d.job_id, "cancel", str(d.reason), d.message)
