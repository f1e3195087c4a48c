"""Drains and maintenance windows: ``POST /v1/nodes/{node}/drain``, ``.../undrain``,
``GET /v1/maintenance`` (drains and windows), ``POST /v1/maintenance``,
``DELETE /v1/maintenance/{id}``.

Changing them is the admin's (a tenant gets 403); reading them is anyone's: the pending reasons
a tenant reads name them anyway. The work is ``plane/maintenance.py``'s, on the reconciler's
thread.

No ``from __future__ import annotations``: FastAPI resolves the routes' local ``Annotated``
aliases at definition time.
"""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, status
from fastapi.exceptions import HTTPException
from pydantic import BaseModel, Field

from gpufence.control.base.config import ADMIN
from gpufence.control.http.auth import tenant_dependency
from gpufence.control.http.problems import error_responses
from gpufence.control.http.schemas import ok
from gpufence.control.plane import CALL_TIMEOUT_S, AccessError, ControlPlane
from gpufence.control.plane import maintenance as mt

MAX_S = 10 * 365 * 86400.0  # ten years: anything longer is a typo
MAX_TIME = 1e11  # a Unix time (year ~5000), not milliseconds


class DrainBody(BaseModel):
    reason: str = Field(min_length=1, max_length=mt.MAX_TEXT, description="why, for the table")
    deadline_s: float | None = Field(
        default=None,
        ge=0,
        le=MAX_S,
        description="stop running work this long from now (noticed first); none: it finishes",
    )


class WindowBody(BaseModel):
    nodes: list[str] = Field(min_length=1, max_length=10_000)
    duration_s: float = Field(gt=0, le=MAX_S)
    reason: str = Field(min_length=1, max_length=mt.MAX_TEXT)
    start: float | None = Field(default=None, ge=0, le=MAX_TIME, description="a Unix time")
    start_in_s: float | None = Field(default=None, ge=0, le=MAX_S, description="or from now")


class DrainOut(BaseModel):
    node: str
    reason: str
    deadline: float | None = Field(description="running work stopped by then (Unix time)")
    since: float
    by: str = Field(description="who drained it")


class UndrainOut(BaseModel):
    node: str
    drained: bool


class WindowOut(BaseModel):
    id: str = Field(description="m1, m2, ...")
    nodes: list[str]
    start: float = Field(description="Unix time (the server's clock)")
    end: float
    duration_s: float
    reason: str
    state: str = Field(description="scheduled, active or over")
    by: str


class WindowAdded(WindowOut):
    running_into: list[str] = Field(
        description="jobs running on its nodes that may still run when it begins (left running)"
    )


class MaintenanceList(BaseModel):
    now: float = Field(description="the server's clock")
    drains: list[DrainOut]
    maintenance: list[WindowOut]


class DeletedOut(BaseModel):
    id: str
    deleted: bool


NodeName = Annotated[str, Path(min_length=1, max_length=128)]
WindowId = Annotated[str, Path(min_length=1, max_length=32)]


def _admin(tenant: str, what: str) -> None:
    if tenant != ADMIN:
        raise AccessError(f"{what} is for the admin (use the admin token)")


def maintenance_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter(tags=["maintenance"])
    Tenant = Annotated[str, Depends(tenant_dependency(plane.config))]
    store = plane.store

    def run(fn: Any) -> dict[str, Any]:
        try:
            out: dict[str, Any] = plane.reconciler.call(fn).result(CALL_TIMEOUT_S)
        except mt.NotFound as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc.args[0])) from None
        return out

    @router.post(
        "/v1/nodes/{node}/drain",
        responses=ok(DrainOut) | error_responses(401, 403, 422, 503),
        response_model=None,
    )
    def drain(node: NodeName, body: DrainBody, tenant: Tenant) -> dict[str, Any]:
        """No new work on the node; running work finishes, or with ``deadline_s`` is noticed
        now and stopped (requeued) by then."""
        _admin(tenant, "draining a node")
        return run(lambda r: mt.drain(r, store, node, body.reason, body.deadline_s, tenant))

    @router.post(
        "/v1/nodes/{node}/undrain",
        responses=ok(UndrainOut) | error_responses(401, 403, 404, 422, 503),
        response_model=None,
    )
    def undrain(node: NodeName, tenant: Tenant) -> dict[str, Any]:
        """The node takes work again (notices a drain deadline gave are withdrawn)."""
        _admin(tenant, "undraining a node")
        return run(lambda r: mt.undrain(r, store, node, tenant))

    @router.get(
        "/v1/maintenance",
        responses=ok(MaintenanceList) | error_responses(401, 503),
        response_model=None,
    )
    def listing(_tenant: Tenant) -> dict[str, Any]:
        """The drained nodes and the maintenance windows (scheduled, active, over)."""
        return run(lambda r: mt.listing(r, store))

    @router.post(
        "/v1/maintenance",
        responses=ok(WindowAdded) | error_responses(401, 403, 422, 503),
        response_model=None,
    )
    def add(body: WindowBody, tenant: Tenant) -> dict[str, Any]:
        """A maintenance window on ``nodes`` from ``start`` (or ``start_in_s`` from now) for
        ``duration_s``: jobs whose time limit would reach into it (and jobs without one) do
        not start on those nodes, and during it they take no work."""
        _admin(tenant, "scheduling maintenance")
        ask = mt.WindowAsk(
            tuple(body.nodes), body.duration_s, body.reason, body.start, body.start_in_s
        )
        return run(lambda r: mt.add_window(r, store, ask, tenant))

    @router.delete(
        "/v1/maintenance/{window_id}",
        responses=ok(DeletedOut) | error_responses(401, 403, 404, 422, 503),
        response_model=None,
    )
    def delete(window_id: WindowId, tenant: Tenant) -> dict[str, Any]:
        """Call the window off: its nodes take work again at once."""
        _admin(tenant, "deleting maintenance")
        return run(lambda r: mt.delete_window(r, store, window_id, tenant))

    return router
