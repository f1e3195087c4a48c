"""The cluster routes: ``GET /v1/nodes``, ``/v1/partitions``, ``/v1/events`` (the decision
log) and ``/v1/advice``.

A tenant sees only its own job ids on the nodes (the others' jobs are counts), only its own
jobs' decisions and only advice about its own jobs; the admin sees everything.

No ``from __future__ import annotations``: FastAPI resolves the routes' local ``Annotated``
aliases at definition time.
"""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from gpufence.control.base.config import ADMIN
from gpufence.control.base.tenantview import others_summary
from gpufence.control.http import schemas as out
from gpufence.control.http.auth import tenant_dependency
from gpufence.control.http.jobs_routes import MAX_SEQ, QueryText, row_of
from gpufence.control.http.problems import error_responses
from gpufence.control.http.schemas import ok
from gpufence.control.plane import ControlPlane


def cluster_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter(tags=["cluster"])
    Tenant = Annotated[str, Depends(tenant_dependency(plane.config))]

    @router.get(
        "/v1/nodes",
        responses=ok(out.NodeList) | error_responses(401, 503),
        response_model=None,
    )
    def nodes(tenant: Tenant) -> dict[str, Any]:
        """Every node and GPU: partition, state (free/used/down), jobs, MIG slots. A tenant sees
        only its own job ids; other tenants' jobs are counts (``other_tenants_jobs`` per GPU,
        ``other_tenants_gpus`` per node, ``other_tenants`` in all)."""
        ns = plane.nodes(tenant)
        out: dict[str, Any] = {"nodes": ns}
        others = others_summary(ns)
        if others is not None:
            out["other_tenants"] = others
        return out

    @router.get(
        "/v1/partitions",
        responses=ok(out.PartitionList) | error_responses(401, 503),
        response_model=None,
    )
    def partitions(_tenant: Tenant) -> dict[str, Any]:
        """The fences: capacity, used, lent and borrowed GPUs, pending/running jobs."""
        return {"partitions": plane.partitions()}

    @router.get(
        "/v1/events",
        responses=ok(out.EventList) | error_responses(401, 403, 404, 422, 503),
        response_model=None,
    )
    def events(
        tenant: Tenant,
        job: QueryText | None = None,
        after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> dict[str, Any]:
        """The decision log (seq > after): one job's for anyone who may see it, all for admins."""
        if job is not None:
            row_of(plane, job, tenant)  # 403 / 404 first
        rows = plane.events(tenant, job_id=job, after_seq=after, limit=limit)
        return {"events": rows, "next_after": rows[-1]["seq"] if rows else after}

    @router.get(
        "/v1/advice",
        responses=ok(out.AdviceList) | error_responses(401, 503),
        response_model=None,
    )
    def advice(tenant: Tenant) -> dict[str, Any]:
        """Capacity advice from this control plane's own history (``gpufence advise``): for the
        admin, the spec rules with the history's numbers and every live rule; for a tenant,
        only advice about its own jobs (never another tenant's or the cluster's sizing)."""
        items = plane.advice(tenant)  # see gpufence.advice: rule, severity, evidence, fix
        return {
            "advice": [a.to_json() for a in items],
            "scope": plane.advice_scope(tenant),
            # the cluster file the paths and lines refer to: the server's path, the admin's
            "spec": plane.advice_source if tenant == ADMIN else None,
        }

    return router
