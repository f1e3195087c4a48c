"""The operations routes, open as scrapers and load balancers expect: ``/metrics``
(Prometheus; ``control.telemetry.metrics_auth: admin`` closes it to all but the admin token,
since it names tenants, queues and jobs), ``/healthz`` (liveness) and ``/readyz`` (the store
takes writes)."""

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import HTTPException
from prometheus_client import CONTENT_TYPE_LATEST

from gpufence import __version__
from gpufence.control.base.config import ADMIN
from gpufence.control.http import schemas as out
from gpufence.control.http.auth import one_header, tenant_of_header, unauthorized
from gpufence.control.http.problems import error_responses, problem
from gpufence.control.plane import ControlPlane


def ops_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter(tags=["ops"])

    @router.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {
                "description": "Prometheus text exposition format",
                "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
            },
            **error_responses(401),
        },
    )
    def metrics(request: Request) -> Response:
        """Prometheus exposition: open, as scrapers expect, unless
        ``control.telemetry.metrics_auth: admin`` (then the admin token, 401 without it)."""
        if plane.config.telemetry.metrics_auth == "admin":
            why = "/metrics needs the admin token (control.telemetry.metrics_auth)"
            try:
                who = tenant_of_header(
                    plane.config, one_header(request.headers.getlist("authorization"))
                )
            except HTTPException:
                raise unauthorized(why) from None
            if who != ADMIN:
                raise unauthorized(why)
        return Response(plane.metrics(), media_type=CONTENT_TYPE_LATEST)

    @router.get("/healthz", response_model=out.Health)
    def healthz() -> dict[str, Any]:
        """Liveness, and whether the store takes writes (``store``: ``ok`` or the reason)."""
        why = plane.store.problem()
        return {"ok": True, "version": __version__, "store": why or "ok"}

    @router.get("/readyz", response_model=out.Health, responses=error_responses(503))
    def readyz() -> Any:
        """Readiness: 200 while the store takes writes, else 503 with why (a load balancer or a
        probe sends no submits then); ``/healthz`` stays 200 while the process lives."""
        why = plane.store.problem()
        if why is not None:
            return problem(503, why, slug="store-unavailable", headers={"Retry-After": "1"})
        return {"ok": True, "version": __version__, "store": "ok"}

    return router
