"""``PATCH /v1/jobs/{ref}``: change a pending or running job (``gpufence update``, issue 32).

The body (``jobupdate.UpdateRequest``) names the fields to change: ``priority``,
``time_limit_s`` (pending or running), ``partition`` and ``queue`` (pending only). The reference
is an id, an array's id (every task of it not ended) or a name, as for hold and release. The
rules and their order are ``reconciler/update_writes.py``'s; each change is stored with an
audit event ``update`` (``GET /v1/jobs/{id}/events``) and reaches the scheduler as
``JobUpdated`` in the same cycle.

Status codes: 200; 401 missing or bad token; 403 a rule of who may (a tenant raising a time
limit, a priority above the default, another tenant's queue or job); 404 no such job or name;
409 a state that does not allow the change (a running job's partition, an ended job); 413 a
body over the limit; 422 a value a submit would refuse (a partition that does not exist or
cannot hold the job, a time limit shorter than the estimate); 503 the store or the reconciler is
unavailable.
"""

from concurrent.futures import Future
from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from gpufence.control.base.jobupdate import UpdateRequest
from gpufence.control.http.auth import tenant_dependency
from gpufence.control.http.job_actions import Ref, lookup
from gpufence.control.http.problems import error_responses
from gpufence.control.plane import CALL_TIMEOUT_S, ControlPlane
from gpufence.control.reconciler.inbox import CancelError
from gpufence.control.store import database as st
from gpufence.control.store import names as job_names


class UpdatedJob(BaseModel):
    id: str
    state: str = Field(description="the job's state when the change was made")


class UpdateResponse(BaseModel):
    """The jobs the reference denoted that took the change."""

    jobs: list[UpdatedJob]


def _targets(found: list[job_names.Named], ref: str) -> list[job_names.Named]:
    """One job as named; of several (an array, a name), those not ended (409 if none)."""
    if len(found) == 1:
        return found
    live = [n for n in found if n.state not in st.TERMINAL]
    if not live:
        raise CancelError(f"every job of '{ref}' has ended: an ended job cannot change")
    return live


def update_router(plane: ControlPlane) -> APIRouter:
    """The route (no ``from __future__ import annotations`` here: FastAPI reads the
    annotations at definition)."""
    Tenant = Annotated[str, Depends(tenant_dependency(plane.config))]
    router = APIRouter(tags=["jobs"])

    # the path's parameter is named as GET's (``/v1/jobs/{job_id}``): one path of the document
    @router.patch(
        "/v1/jobs/{job_id}",
        response_model=UpdateResponse,
        responses=error_responses(401, 403, 404, 409, 413, 422, 503),
    )
    def update(job_id: Ref, body: UpdateRequest, tenant: Tenant) -> UpdateResponse:
        """Change a job's priority or time limit (pending or running), or its partition or
        queue (pending); a tenant may only lower a time limit, and raise a priority no higher
        than the default 0."""
        ref = job_id  # an id, an array's id or a name, as hold takes
        targets = _targets(lookup(plane, tenant, ref), ref)
        changes = body.changes()
        # all queued before any is waited for: one cycle and one commit for a whole array
        futures: list[tuple[str, Future[str]]] = [
            (n.id, plane.reconciler.action(n.id, "update", tenant, changes)) for n in targets
        ]
        out: list[UpdatedJob] = []
        for jid, fut in futures:
            try:
                state = fut.result(CALL_TIMEOUT_S)
            except CancelError:
                if len(targets) == 1:
                    raise
                continue  # a task that ended meanwhile: the others take the change
            out.append(UpdatedJob(id=jid, state=state))
        if not out:
            raise CancelError(f"no job of '{ref}' could change: each has ended meanwhile")
        return UpdateResponse(jobs=out)

    return router
