"""Routes for hold / release and job names (issue 15), kept apart from ``api.py``.

``POST /v1/jobs/{ref}/hold`` and ``/release`` take an id or a name (a name of an array holds
or releases every task of it that is pending); ``GET /v1/names/{name}`` says which jobs a name
denotes. A tenant reaches only its own jobs (another tenant's name is simply unknown: 404).
Status codes: 200; 401 missing or bad token; 403 a tenant releasing a job the admin held; 404
no such job or name; 409 a job that is not pending (hold) or not held (release); 413 a body
over the limit; 422 a reference that is too long or not text; 503 the store or the reconciler
is unavailable.
"""

from typing import Annotated

from fastapi import APIRouter, Depends, Path, status
from fastapi.exceptions import HTTPException
from pydantic import BaseModel, Field

from gpufence.control.base.jobspec import MAX_NAME
from gpufence.control.http.auth import tenant_dependency
from gpufence.control.http.problems import error_responses
from gpufence.control.plane import CALL_TIMEOUT_S, ControlPlane
from gpufence.control.reconciler.inbox import CancelError, NotPermitted
from gpufence.control.store import database as st
from gpufence.control.store import names as job_names

Ref = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_NAME,
        description="a job id (j12), an array's id (every task), an array task (j12_3) or a name",
    ),
]

_DONE = {"hold": "held", "release": "released"}


class ActionItem(BaseModel):
    id: str
    state: str = Field(description="the job's state after the action (pending)")
    held: bool


class ActionResponse(BaseModel):
    """The jobs the reference denoted and where each stands now."""

    jobs: list[ActionItem]


class NamedJob(BaseModel):
    id: str
    tenant: str
    state: str
    array: str | None = Field(description="the id of the array it is a task of")
    index: int | None = Field(default=None, description="its index in that array (j4_3: 3)")


class NameResponse(BaseModel):
    name: str
    jobs: list[NamedJob] = Field(
        description="jobs not ended with this name, else the latest one (every task of it "
        "for an array), in submission order"
    )


def lookup(plane: ControlPlane, tenant: str, ref: str) -> list[job_names.Named]:
    """The jobs ``ref`` denotes for ``tenant`` (404 if none)."""
    try:
        with plane.store.reader() as r:
            return r.resolve_ref(tenant, ref)
    except job_names.UnknownJob as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(exc)) from None


def job_actions_router(plane: ControlPlane) -> APIRouter:
    """The routes (FastAPI reads the annotations at definition: no
    ``from __future__ import annotations`` in this module)."""
    Tenant = Annotated[str, Depends(tenant_dependency(plane.config))]
    router = APIRouter(tags=["jobs"])
    # every status each can give (413: a POST body over the limit, as for any POST; 403, of a
    # release only: a tenant releasing what the admin held)
    posted = error_responses(401, 404, 409, 413, 422, 503)
    released = error_responses(401, 403, 404, 409, 413, 422, 503)

    def act(ref: str, tenant: str, kind: str) -> ActionResponse:
        found = lookup(plane, tenant, ref)
        targets = [n for n in found if n.state == st.PENDING] if len(found) > 1 else found
        if not targets:
            raise CancelError(
                f"no job of '{ref}' is pending: only pending jobs can be {_DONE[kind]}"
            )
        out: list[ActionItem] = []
        errors: list[CancelError | NotPermitted] = []
        # every action queued before any is waited for: the reconciler takes them in one cycle
        # (one by one, holding a 2,000-task array took a cycle and a commit per task: minutes)
        futures = [(n, plane.reconciler.action(n.id, kind, tenant)) for n in targets]
        for n, fut in futures:
            try:
                state = fut.result(CALL_TIMEOUT_S)
            except (CancelError, NotPermitted) as exc:
                if len(targets) == 1:
                    raise
                errors.append(exc)
                continue
            out.append(ActionItem(id=n.id, state=state, held=kind == "hold"))
        if not out:  # a refusal (403) says more than a state (409)
            first = next((e for e in errors if isinstance(e, NotPermitted)), None)
            raise first or CancelError("; ".join(str(e) for e in errors))
        return ActionResponse(jobs=out)

    @router.post("/v1/jobs/{ref}/hold", response_model=ActionResponse, responses=posted)
    def hold(ref: Ref, tenant: Tenant) -> ActionResponse:
        """Hold a pending job: it stays pending (reason ``held``) until released."""
        return act(ref, tenant, "hold")

    @router.post("/v1/jobs/{ref}/release", response_model=ActionResponse, responses=released)
    def release(ref: Ref, tenant: Tenant) -> ActionResponse:
        """Release a held job: it may run again when nothing else holds it back."""
        return act(ref, tenant, "release")

    @router.get(
        "/v1/names/{ref}",
        response_model=NameResponse,
        responses=error_responses(401, 404, 422, 503),
    )
    def name(ref: Ref, tenant: Tenant) -> NameResponse:
        """The jobs a name (or an id) denotes: what the CLI resolves names with."""
        found = lookup(plane, tenant, ref)
        return NameResponse(
            name=ref,
            jobs=[
                NamedJob(id=n.id, tenant=n.tenant, state=n.state, array=n.array, index=n.index)
                for n in found
            ],
        )

    return router
