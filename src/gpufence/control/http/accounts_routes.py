"""The admin's routes for accounts and QOS at run time (issue 32): tenants, tokens, queues.

``/v1/admin/tenants`` (list, add, remove), ``/v1/admin/tokens`` (list, issue, revoke, rotate),
``/v1/admin/queues`` (list, change weight and quota) and ``/v1/admin/audit``. The admin token
only: any other is a 403 naming the rule. A token's secret is in the answer to its issue or
rotate and nowhere else (lists give ids). What wins over the YAML, and when a change takes
effect: ``control/plane/admin_accounts.py``.
Status codes: 200; 201 created (tenant, token); 401; 403 not the admin; 404 no
such tenant, token or queue; 409 a tenant with jobs not ended, a name taken, a token no
longer active; 413; 422 a field (named) out of range; 503 the store or the reconciler.
"""

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Path, Query, status
from fastapi.exceptions import HTTPException
from pydantic import BaseModel, Field

from gpufence.control.http.auth import tenant_dependency
from gpufence.control.http.problems import error_responses
from gpufence.control.plane import ControlPlane
from gpufence.control.plane.admin_accounts import (
    AccountConflict,
    AdminOnly,
    UnknownAccount,
    token_view,
)

T = TypeVar("T")
MAX_S = 10 * 365 * 86400.0  # ten years: longer is a typo, not a policy
Name = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]
TokenId = Annotated[str, Path(min_length=1, max_length=32, pattern=r"^tok-[0-9a-f]+$")]


class TenantIn(BaseModel):
    name: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="letters, digits, '.', '_' or '-'; not 'admin'",
    )
    run_as: str | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="the Unix user its jobs run as (default: as a YAML tenant without one)",
    )
    allow_root: bool = Field(default=False, description="run_as may be root (uid 0)")


class TenantOut(BaseModel):
    name: str
    source: str = Field(description="yaml (the cluster file) or runtime (added by the admin)")
    tokens: int = Field(description="its active tokens issued at run time")


class Removed(BaseModel):
    name: str
    removed: bool


class TokenIn(BaseModel):
    tenant: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    expires_in_s: float | None = Field(
        default=None, gt=0, le=MAX_S, description="seconds it stays valid; none: no expiry"
    )


class RotateIn(BaseModel):
    overlap_s: float = Field(
        default=0.0, ge=0, le=MAX_S, description="seconds the old secret keeps working"
    )
    expires_in_s: float | None = Field(default=None, gt=0, le=MAX_S)


class TokenOut(BaseModel):
    id: str
    tenant: str
    status: str = Field(description="active, expired, revoked or rotated")
    created_at: str
    expires_at: str | None
    revoked_at: str | None
    replaced_by: str | None


class IssuedToken(TokenOut):
    token: str = Field(description="the secret: shown this once, kept only as its SHA-256")


class QueueIn(BaseModel):
    weight: float | None = Field(default=None, gt=0, le=1e6, description="fair-share weight")
    quota_gpus: float | None = Field(
        default=None,
        ge=0,
        le=1e6,
        description="nominal quota in GPUs; null: no quota; left out: unchanged",
    )


class QueueOut(BaseModel):
    queue: str
    partition: str
    tenant: str
    weight: float
    quota_gpus: float | None
    weight_source: str = Field(description="yaml, or runtime: set by the admin (it wins)")
    quota_source: str


class AuditOut(BaseModel):
    seq: int
    at: str
    actor: str
    action: str
    target: str
    old: str = Field(description="JSON of the value before ('' for a creation)")
    new: str


def _answer(fn: Callable[[], T]) -> T:
    """The plane's refusals as problems: 403 the rule, 404 unknown, 409 the state."""
    try:
        return fn()
    except AdminOnly as exc:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail=str(exc)) from None
    except UnknownAccount as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(exc.args[0])) from None
    except AccountConflict as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from None


def accounts_router(plane: ControlPlane) -> APIRouter:
    """(FastAPI reads the annotations at definition: no ``from __future__ import
    annotations`` in this module.)"""
    Caller = Annotated[str, Depends(tenant_dependency(plane.config))]
    admin = plane.accounts
    router = APIRouter(tags=["admin"])
    read = error_responses(401, 403, 422, 503)
    write = error_responses(401, 403, 404, 409, 413, 422, 503)

    @router.get("/v1/admin/tenants", response_model=list[TenantOut], responses=read)
    def tenants(caller: Caller) -> list[dict[str, Any]]:
        """Every tenant now: the YAML's, less those removed, with those added at run time."""
        return _answer(lambda: admin.tenants(caller))

    @router.post("/v1/admin/tenants", response_model=TenantOut, status_code=201, responses=write)
    def add_tenant(body: TenantIn, caller: Caller) -> dict[str, Any]:
        """Add a tenant (then issue it a token: POST /v1/admin/tokens)."""
        return _answer(lambda: admin.add_tenant(caller, body.name, body.run_as, body.allow_root))

    @router.delete("/v1/admin/tenants/{name}", response_model=Removed, responses=write)
    def remove_tenant(name: Name, caller: Caller) -> Removed:
        """Remove a tenant with no job pending or running (409 otherwise); its tokens end."""
        _answer(lambda: admin.remove_tenant(caller, name))
        return Removed(name=name, removed=True)

    @router.get("/v1/admin/tokens", response_model=list[TokenOut], responses=read)
    def tokens(
        caller: Caller,
        tenant: Annotated[str | None, Query(max_length=64, pattern=r"^[A-Za-z0-9._-]+$")] = None,
    ) -> list[dict[str, Any]]:
        """Tokens issued at run time, by id (never their secrets)."""
        return _answer(lambda: admin.tokens(caller, tenant))

    @router.post("/v1/admin/tokens", response_model=IssuedToken, status_code=201, responses=write)
    def issue(body: TokenIn, caller: Caller) -> dict[str, Any]:
        """Issue a token for a tenant; its secret is in this answer only."""
        secret, rec = _answer(lambda: admin.issue(caller, body.tenant, body.expires_in_s))
        return {**token_view(rec, rec.created_at), "token": secret}

    @router.post("/v1/admin/tokens/{token_id}/revoke", response_model=TokenOut, responses=write)
    def revoke(token_id: TokenId, caller: Caller) -> dict[str, Any]:
        """Revoke a token now: it gets 401 from then on."""
        return _answer(lambda: admin.revoke(caller, token_id))

    @router.post(
        "/v1/admin/tokens/{token_id}/rotate",
        response_model=IssuedToken,
        status_code=201,
        responses=write,
    )
    def rotate(token_id: TokenId, body: RotateIn, caller: Caller) -> dict[str, Any]:
        """A new secret in place of this token's; the old one stops after ``overlap_s``."""
        secret, rec = _answer(
            lambda: admin.rotate(caller, token_id, body.overlap_s, body.expires_in_s)
        )
        return {**token_view(rec, rec.created_at), "token": secret}

    @router.get("/v1/admin/queues", response_model=list[QueueOut], responses=read)
    def queues(caller: Caller) -> list[dict[str, Any]]:
        """Every queue's weight and quota now, and whether the YAML or the admin set each."""
        return _answer(lambda: admin.queues(caller, dict(plane.cluster.queues)))

    @router.patch("/v1/admin/queues/{queue}", response_model=QueueOut, responses=write)
    def set_queue(queue: Name, body: QueueIn, caller: Caller) -> dict[str, Any]:
        """Change a queue's weight and/or quota; the next scheduling cycle uses them. A quota
        lowered below what the queue runs stops nothing: it keeps new work waiting."""
        quota = ("quota_gpus" in body.model_fields_set, body.quota_gpus)
        return _answer(lambda: admin.set_queue(caller, queue, body.weight, quota))

    @router.get("/v1/admin/audit", response_model=list[AuditOut], responses=read)
    def audit(
        caller: Caller, limit: Annotated[int, Query(ge=1, le=1000)] = 100
    ) -> list[dict[str, Any]]:
        """The newest changes to tenants, tokens and queues first: who, what, when, old, new."""
        return _answer(lambda: admin.audit(caller, limit))

    return router
