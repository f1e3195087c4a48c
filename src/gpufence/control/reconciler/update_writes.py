"""The store side of ``gpufence update`` (``PATCH /v1/jobs/{ref}``): one change to one job.

Inside the inbox transaction, in this order, each refusal answered to the caller and nothing
written:

1. who may (``jobupdate.rule_broken``, a tenant only lowers; a queue of another tenant's is
   theirs as at submit): ``NotPermitted`` (403);
2. the job with the change passes a submit's validation (``jobupdate.apply_to``):
   ``InvalidField`` (422) naming the field;
3. the core's own verdict (``sched.update.judge``, the function the core applies the event
   with, so the plane keeps no scheduling rule of its own): ``CancelError`` (409) for a state
   that does not allow it (a running job's partition), ``InvalidField`` (422) for a partition
   or queue that cannot hold it.

Then the new spec is stored (a restart submits or restores the job as changed: a running job's
time limit counts from its attempt's start, the stored ``started_at``), its partition and queue
columns when they change, an audit event ``update`` (who, each field old -> new), and the
core gets ``JobUpdated`` in the same cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufence.control.base.config import ADMIN
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.base.jobupdate import (
    UpdateInvalid,
    apply_to,
    describe,
    effective,
    rule_broken,
)
from gpufence.control.reconciler.inbox import (
    Action,
    CancelError,
    InvalidField,
    NotPermitted,
    Staged,
)
from gpufence.control.store import database as st
from gpufence.model.events import JobUpdated
from gpufence.sched.intake import Refused
from gpufence.sched.update import Conflict, judge

if TYPE_CHECKING:
    from gpufence.control.reconciler.context import WriteContext
    from gpufence.control.reconciler.seam import JobTx


def write_update(ctx: WriteContext, tx: JobTx, it: Action, now: float, staged: Staged) -> None:
    row = tx.job(it.job_id)
    changes = effective(row.spec, it.changes)
    try:
        if not changes:  # nothing to change (a retry): only a state that takes none refuses
            _judge(ctx, JobUpdated(it.job_id), {})
            staged.replies.append((it.future, row.state))
            return
        spec, event, home = _judged(ctx, row, it.by, changes)
    except (NotPermitted, InvalidField, CancelError) as exc:
        staged.replies.append((it.future, exc))
        return
    tx.set_spec(it.job_id, spec)
    # only a move writes the home: two updates of one job in one batch are judged before the
    # core has taken the first, and a priority change must not write back the old home
    moves = "partition" in changes or "queue" in changes
    if moves and home is not None and home != (row.partition, row.queue):
        tx.set_homes([(it.job_id, home[0], home[1])])
    what = describe(row.spec, changes)
    tx.log(now, it.job_id, "update", "", f"by {it.by or ADMIN}: {what}")
    staged.events.append(event)
    live = ctx.live.get(it.job_id)
    if live is not None:  # once committed, what the plane keeps of a running job follows
        req = SubmitRequest.model_validate(spec)
        staged.effects.append(lambda: setattr(live, "spec", req))
    staged.replies.append((it.future, row.state))


def _judged(
    ctx: WriteContext, row: st.JobRow, by: str, changes: dict[str, Any]
) -> tuple[dict[str, Any], JobUpdated, tuple[str, str] | None]:
    """(the spec to store, the core's event, the new (partition, queue) of a pending job)."""
    if by != ADMIN:
        broken = rule_broken(row.spec, changes) or _foreign_queue(ctx, by, changes)
        if broken is not None:
            raise NotPermitted(f"job {row.id}: {broken}")
    try:
        spec = apply_to(row.spec, changes)
    except UpdateInvalid as exc:
        raise InvalidField(("body", exc.field), str(exc)) from None
    event = JobUpdated(row.id, **changes)
    home = _judge(ctx, event, changes)
    return spec, event, home if row.state == st.PENDING else None


def _judge(ctx: WriteContext, event: JobUpdated, changes: dict[str, Any]) -> tuple[str, str]:
    """The core's verdict (``sched.update.judge``) as the plane answers it: where the job
    then lives, or the refusal to raise."""
    view = ctx.scheduler
    verdict = judge(
        view.cluster, view.jobs().get(event.job_id), event, view.ledger.mig, view.config.tenants
    )
    if isinstance(verdict, Conflict):
        raise CancelError(verdict.message)
    if isinstance(verdict, Refused):
        raise InvalidField(("body", _field_of(verdict.message, changes)), verdict.message)
    return verdict.home, verdict.queue


def _foreign_queue(ctx: WriteContext, tenant: str, changes: dict[str, Any]) -> str | None:
    """A queue owned by another configured tenant takes that tenant's jobs only (as at
    submit: ``ControlPlane._check_queue``)."""
    name = changes.get("queue")
    q = ctx.scheduler.cluster.queues.get(name) if name else None
    if q is not None and q.tenant in ctx.config.tenants and q.tenant != tenant:
        return f"queue '{name}' belongs to tenant '{q.tenant}'"
    return None


def _field_of(message: str, changes: dict[str, Any]) -> str:
    """The changed field a refusal of the core is about (the first it names)."""
    for f in ("queue", "partition", "time_limit_s", "priority"):
        if f in changes and f.split("_")[0] in message:
            return f
    return "partition" if "partition" in changes else next(iter(changes), "partition")
