"""``GET /v1/history`` and ``GET /v1/usage``: accounting from the store (``store/accounting.py``).

Scoped like the job routes: a tenant sees only its own jobs (``?tenant=`` of another is a 403),
the admin all of them or one tenant's. Times are seconds since the epoch; the window selects
what overlaps ``[since, until)``. GPU-hours count GPU-equivalents: a whole GPU 1, a fractional
share its fraction, a MIG instance its compute slices out of 7 (as the quota is charged).

No ``from __future__ import annotations``: FastAPI resolves the routes' local ``Annotated``
aliases at definition time.
"""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import AfterValidator

from gpufence.control.base.config import ADMIN
from gpufence.control.base.jobspec import NO_CONTROL_PATTERN
from gpufence.control.http.auth import tenant_dependency
from gpufence.control.http.problems import error_responses
from gpufence.control.http.schemas import HistoryPage, UsageReport
from gpufence.control.plane import AccessError, ControlPlane
from gpufence.control.store import database as st

MAX_SEQ = 2**63 - 1
MAX_TIME = 1e12  # seconds since the epoch: far past any real date, and finite
ERRORS = (401, 403, 422, 503)


def query_text(value: str | None) -> str | None:
    """Query strings go to SQLite: valid UTF-8, no control characters (else 422, not 500)."""
    if value is not None:
        value.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError, a ValueError
        if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
            raise ValueError("contains a control character")
    return value


NO_CONTROL = {"pattern": NO_CONTROL_PATTERN}  # query_text's rule, for the OpenAPI document
Text = Annotated[
    str | None, Query(max_length=128, json_schema_extra=NO_CONTROL), AfterValidator(query_text)
]
Seconds = Annotated[float, Query(ge=0, le=MAX_TIME, description="seconds since the epoch")]


def _scope(tenant: str, only: str | None) -> str | None:
    """The tenant whose jobs the caller may read: its own, or for the admin ``only`` (None:
    everyone's)."""
    if tenant == ADMIN:
        return only
    if only not in (None, tenant):
        raise AccessError("a tenant reads only its own accounting")
    return tenant


def _empty(since: float | None, until: float | None) -> bool:
    """``[since, until)`` holds no time: ``until`` at or before ``since``. Answered as what it
    is, an empty window (no jobs, no GPU-hours), not a 422: OpenAPI cannot say that one query
    parameter must exceed another, and a request the document calls valid is not refused."""
    return since is not None and until is not None and until <= since


def accounting_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter(tags=["accounting"])
    Tenant = Annotated[str, Depends(tenant_dependency(plane.config))]
    TenantFilter = Annotated[
        str | None,
        Query(
            alias="tenant",
            max_length=128,
            description="admin: one tenant's jobs only",
            json_schema_extra=NO_CONTROL,
        ),
        AfterValidator(query_text),
    ]

    @router.get("/v1/history", response_model=HistoryPage, responses=error_responses(*ERRORS))
    def history(
        tenant: Tenant,
        since: Seconds | None = None,
        until: Seconds | None = None,
        tenant_filter: TenantFilter = None,
        partition: Text = None,
        state: Annotated[
            list[Literal[st.STATES]] | None,  # type: ignore[valid-type]
            Query(description=f"repeatable; one of {', '.join(st.STATES)}"),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
        after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="jobs with seq > after")] = 0,
    ) -> dict[str, Any]:
        """Jobs whose life (submitted -> ended, or now) overlaps ``[since, until)``, in
        submission order, with their accounting: queue delay, elapsed, GPUs, GPU-hours,
        attempts, preemptions (``gpufence history``)."""
        who = _scope(tenant, tenant_filter)
        if _empty(since, until):
            return {"jobs": [], "next_after": after}
        with plane.store.reader() as r:
            rows = r.history(
                now=plane.now(),
                since=since,
                until=until,
                tenant=who,
                partition=partition,
                states=tuple(state or ()),
                after_seq=after,
                limit=limit,
            )
        return {"jobs": rows, "next_after": rows[-1]["seq"] if rows else after}

    @router.get("/v1/usage", response_model=UsageReport, responses=error_responses(*ERRORS))
    def usage(
        tenant: Tenant,
        by: Literal["tenant", "partition", "class"] = "tenant",
        since: Seconds = 0.0,
        until: Seconds | None = None,
        tenant_filter: TenantFilter = None,
    ) -> dict[str, Any]:
        """GPU-hours held in ``[since, until)`` (default: until now), per tenant, partition or
        class, with the jobs that held GPUs and the queue delay (p50, p95) of the jobs first
        bound in the window (``gpufence usage``)."""
        who = _scope(tenant, tenant_filter)
        if _empty(since, until):
            until = since  # a window of no time: nothing held in it
        now = plane.now()
        with plane.store.reader() as r:
            groups, total = r.accounting_usage(by=by, now=now, since=since, until=until, tenant=who)
        end = now if until is None else min(until, now)
        return {"by": by, "since": since, "until": end, "groups": groups, "total": total}

    return router
