"""The observation routes of the HTTP API (included by ``api.make_app``):

* ``GET /v1/series?since=&until=&step=`` — the joint view's data on one time axis (serving
  request rate, replicas and p99 vs SLO per deployment; queue delay per class; link and GPU
  utilisation; the data dir's disk; marks from the decision log). See
  ``control/observe/series_model.py`` for the answer and ``series_view.py`` for how a tenant's
  view differs from the admin's.
* ``POST /v1/jobs/{id}/latency`` — a serving replica reports latencies it measured itself
  (``{"latencies_ms": [...]}``, at most 10,000 a call), with its tenant's token.

Errors are rendered by the API's problem handlers as RFC 7807 problems (documented per route
with ``error_responses``): 422 a parameter or body field (``InvalidField``), 403 another
tenant's job, 404 no such job, 409 a job that is not a running serving job, 503 the control
plane did not answer in time.
"""

# no ``from __future__ import annotations``: FastAPI reads the route signatures' types at runtime
import math
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, status
from pydantic import BaseModel, Field, field_validator

from gpufence.control.http.accounting_routes import MAX_TIME
from gpufence.control.http.auth import tenant_dependency
from gpufence.control.http.problems import ERRORS_ALL, error_responses
from gpufence.control.observe.observatory import MAX_PUSH
from gpufence.control.observe.series_model import SeriesResponse
from gpufence.control.observe.series_view import SeriesQueryError
from gpufence.control.plane import AccessError, ControlPlane, InvalidField, NotServingError

MAX_LATENCY_MS = 3_600_000.0


class LatencyPush(BaseModel):
    latencies_ms: list[float] = Field(
        min_length=1,
        max_length=MAX_PUSH,
        description="request latencies in milliseconds measured by the replica since its last push",
        # _finite's range, for the OpenAPI document
        json_schema_extra={"items": {"type": "number", "minimum": 0.0, "maximum": MAX_LATENCY_MS}},
    )

    @field_validator("latencies_ms")
    @classmethod
    def _finite(cls, v: list[float]) -> list[float]:
        for i, x in enumerate(v):
            if not math.isfinite(x) or not 0.0 <= x <= MAX_LATENCY_MS:
                raise ValueError(
                    f"latencies_ms[{i}] = {x!r}: each latency must be a number of milliseconds "
                    f"from 0 to {MAX_LATENCY_MS:g}"
                )
        return v


class LatencyAccepted(BaseModel):
    job_id: str
    deployment: str
    accepted: int


def telemetry_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter(tags=["observation"])
    Tenant = Annotated[str, Depends(tenant_dependency(plane.config))]

    @router.get("/v1/series", response_model=SeriesResponse, responses=error_responses(*ERRORS_ALL))
    def series(
        tenant: Tenant,
        since: Annotated[
            float | None,
            Query(
                ge=0,
                le=MAX_TIME,
                description="unix seconds; default: 15 minutes before until (or the start)",
            ),
        ] = None,
        until: Annotated[
            float | None, Query(ge=0, le=MAX_TIME, description="unix seconds; default: now")
        ] = None,
        step: Annotated[
            float | None,
            Query(
                gt=0,
                le=MAX_TIME,  # finite: step=inf made the axis NaN (a 500)
                description="bucket width in seconds; default: the range / 300, never "
                "below the sampling step (control.telemetry.series_step_s)",
            ),
        ] = None,
    ) -> SeriesResponse:
        """The joint view on one time axis: serving request rate, replicas and p99 vs SLO per
        deployment; queue delay per class; NVLink, PCIe and NIC utilisation; GPU utilisation;
        storage wait; preemption, reclaim, notice, requeue and node marks. A tenant sees its
        own deployments and marks; other tenants' are counts (``other_tenants``)."""
        try:
            return plane.series(tenant, since, until, step)
        except SeriesQueryError as exc:
            raise InvalidField(("query", exc.field), str(exc)) from None
        except TimeoutError:
            raise HTTPException(
                503, detail="the control plane did not answer in time; try again"
            ) from None

    @router.post(
        "/v1/jobs/{job_id}/latency",
        status_code=status.HTTP_202_ACCEPTED,
        response_model=LatencyAccepted,
        responses=error_responses(*ERRORS_ALL),  # 409: not a serving job, or not running
    )
    def push_latency(job_id: str, body: LatencyPush, tenant: Tenant) -> LatencyAccepted:
        """A serving replica reports latencies it measured (its deployment's p99 and SLO
        attainment count them with the scraped ones)."""
        try:
            key = plane.push_latency(job_id, tenant, body.latencies_ms)
        except AccessError as exc:
            raise HTTPException(403, detail=str(exc)) from None
        except KeyError:
            raise HTTPException(404, detail=f"no job {job_id}") from None
        except NotServingError as exc:
            raise HTTPException(409, detail=str(exc)) from None
        return LatencyAccepted(job_id=job_id, deployment=key.name, accepted=len(body.latencies_ms))

    return router
