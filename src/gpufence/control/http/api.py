"""The HTTP API of the control plane (FastAPI): ``make_app(plane)``.

Every ``/v1`` route needs ``Authorization: Bearer <token>``: a tenant sees and cancels only its
own jobs (403 otherwise), the admin token sees everything. The web dashboard's page and assets
(``/``, ``/ui/*``: no data, the page asks for a token) are open, and so are ``/metrics``
(Prometheus) and ``/healthz``, as scrapers and load balancers expect: put the server behind a
proxy if queue sizes per partition must stay private.

Status codes: 201 job accepted (pending or already starting); 422 invalid body (FastAPI's
field-level ``detail``) *or* a job the cluster can never hold: the scheduler rejects it at submit,
``detail[0].type`` is ``"rejected"``, ``detail[0].reason`` the machine-readable reason, and the
job (state ``rejected``) stays in the store so ``GET /v1/jobs/{id}`` shows it; 401 missing or
bad token; 403 another tenant's job or queue; 404 unknown job; 409 cancelling an ended job;
503 the reconciler did not answer in time.

The plane's methods block (SQLite reads, a round trip to the reconciler thread), so every route
is a plain ``def``: FastAPI runs it in its thread pool and the event loop stays free.
"""

import dataclasses
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response, status
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from gpufence import __version__
from gpufence.control.http.auth import tenant_dependency
from gpufence.control.http.dashboard_routes import dashboard_router
from gpufence.control.http.telemetry_routes import telemetry_router
from gpufence.control.inbox import CancelError
from gpufence.control.jobspec import SubmitRequest, from_stored
from gpufence.control.plane import AccessError, ControlPlane
from gpufence.control.store import database as st
from gpufence.control.tenantview import others_summary

UNPROCESSABLE = 422  # starlette renamed the constant (..._CONTENT); the number is stable
MAX_LOG_CHUNK = 1 << 20
"""Bytes of log one request returns at most; the client pages with ``offset``."""

# response headers of GET /v1/jobs/{id}/logs
LOG_OFFSET = "X-Log-Offset"  # where the next read starts
LOG_SIZE = "X-Log-Size"  # the file's size when read
JOB_STATE = "X-Job-State"  # lets `logs -f` stop when the job has ended
LOG_ATTEMPT = "X-Log-Attempt"  # the attempt these bytes are from
JOB_ATTEMPT = "X-Job-Attempt"  # the job's latest attempt (a follower switches to it)


class SubmitResponse(BaseModel):
    id: str
    state: str
    reason: str = ""
    message: str = ""


class CancelResponse(BaseModel):
    id: str
    state: str


def _gpus(spec: dict[str, Any]) -> str:
    """'2x 4 GPUs', 'mig 1g.10gb', '500m GPU' ... for tables."""
    try:
        req = from_stored(spec)
    except ValueError:
        return "?"
    what = req.request().describe()
    return f"{req.replicas}x {what}" if req.replicas != 1 else what


def job_json(row: st.JobRow) -> dict[str, Any]:
    out = row.public()
    out["seq"] = row.seq
    out["gpus"] = _gpus(row.spec)
    out["name"] = row.spec.get("name")
    return out


def attempt_json(att: st.AttemptRow) -> dict[str, Any]:
    return dataclasses.asdict(att)


def _detail(loc: list[str | int], msg: str, kind: str) -> list[dict[str, Any]]:
    return [{"loc": loc, "msg": msg, "type": kind}]


def _reject_field(req: SubmitRequest, reason: str, message: str) -> list[str | int]:
    """Best guess at the field a reject is about, for ``detail[0].loc``."""
    if "queue" in message and req.queue:
        return ["body", "queue"]
    if "partition '" in message and req.partition:
        return ["body", "partition"]
    if "gpus per replica" in message:
        return ["body", "gpus"]
    if "CPU/memory" in message:
        return ["body", "cpus" if req.cpus is not None else "mem_bytes"]
    if reason == "never-fits":
        if req.mig is not None:
            return ["body", "mig"]
        if req.gpu_fraction is not None:
            return ["body", "gpu_mem_gib" if "MiB" in message else "gpu_fraction"]
        if "gang needs" in message:
            return ["body", "replicas"]
        return ["body", "gpus"]
    return ["body"]


def make_app(plane: ControlPlane) -> FastAPI:
    app = FastAPI(
        title="gpufence",
        version=__version__,
        description=(
            "Control plane of gpufence, a GPU cluster scheduler that fences training, serving, "
            "interactive and batch work. Authenticate with `Authorization: Bearer <token>`."
        ),
    )
    app.state.plane = plane
    app.include_router(telemetry_router(plane))  # /v1/series, /v1/jobs/{id}/latency
    app.include_router(dashboard_router(plane))  # /, /ui/*, /v1/dashboard/*
    Tenant = Annotated[str, Depends(tenant_dependency(plane.config))]

    @app.exception_handler(AccessError)
    def _forbidden(_req: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_403_FORBIDDEN)

    @app.exception_handler(CancelError)
    def _conflict(_req: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_409_CONFLICT)

    @app.exception_handler(TimeoutError)
    def _busy(_req: Request, _exc: Exception) -> JSONResponse:
        return JSONResponse(
            {"detail": "the control plane did not answer in time; try again"},
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        )

    def row_of(job_id: str, tenant: str) -> st.JobRow:
        row = plane.job(job_id, tenant)  # AccessError (403) for another tenant's job
        if row is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job {job_id}")
        return row

    # ------------------------------------------------------------------ jobs
    @app.post(
        "/v1/jobs",
        status_code=status.HTTP_201_CREATED,
        response_model=SubmitResponse,
        tags=["jobs"],
        responses={
            422: {
                "description": "invalid body (field-level detail), or rejected by the scheduler "
                "at submit: detail[0].type == 'rejected', detail[0].reason, and the stored job"
            },
            403: {"description": "another tenant's queue, or 'tenant' set by a non-admin"},
        },
    )
    def submit(req: SubmitRequest, tenant: Tenant) -> Any:
        """Submit a job. A job that no partition can ever hold is rejected here, with why."""
        res = plane.submit(req, tenant)
        if res.state != st.REJECTED:
            return SubmitResponse(
                id=res.job_id, state=res.state, reason=res.reason, message=res.message
            )
        row = plane.job(res.job_id, tenant)
        detail = _detail(
            _reject_field(req, res.reason, res.message), res.message or res.reason, "rejected"
        )
        detail[0]["reason"] = res.reason
        job = job_json(row) if row is not None else {"id": res.job_id, "state": res.state}
        return JSONResponse({"detail": detail, "job": job}, status_code=UNPROCESSABLE)

    @app.get("/v1/jobs", tags=["jobs"])
    def list_jobs(
        tenant: Tenant,
        state: Annotated[
            list[str] | None, Query(description=f"repeatable; one of {', '.join(st.STATES)}")
        ] = None,
        partition: str | None = None,
        tenant_filter: Annotated[
            str | None, Query(alias="tenant", description="admin: one tenant's jobs")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
        after: Annotated[int, Query(ge=0, description="return jobs with seq > after")] = 0,
    ) -> dict[str, Any]:
        """Jobs in submission order; a tenant sees only its own. Pending jobs carry why."""
        states = tuple(state or ())
        bad = [s for s in states if s not in st.STATES]
        if bad:
            raise HTTPException(
                UNPROCESSABLE,
                detail=_detail(
                    ["query", "state"],
                    f"unknown state {bad[0]!r} (valid: {', '.join(st.STATES)})",
                    "enum",
                ),
            )
        rows = plane.jobs(
            tenant,
            states=states,
            partition=partition,
            only_tenant=tenant_filter,
            limit=limit,
            after_seq=after,
        )
        pending_ids = [r.id for r in rows if r.state == st.PENDING]
        why = plane.pending_reasons(pending_ids, tenant) if pending_ids else {}
        jobs = []
        for r in rows:
            j = job_json(r)
            if r.id in why:
                j["pending"] = why[r.id]
            jobs.append(j)
        return {"jobs": jobs, "next_after": rows[-1].seq if rows else after}

    @app.get("/v1/jobs/{job_id}", tags=["jobs"])
    def get_job(job_id: str, tenant: Tenant) -> dict[str, Any]:
        """One job, its attempts (devices, exit codes) and, while pending, why."""
        row = row_of(job_id, tenant)
        out = job_json(row)
        out["attempts"] = [attempt_json(a) for a in plane.attempts(job_id)]
        if row.state == st.PENDING:
            out["pending"] = plane.pending_reasons([job_id], tenant).get(job_id)
        return out

    @app.post("/v1/jobs/{job_id}/cancel", response_model=CancelResponse, tags=["jobs"])
    def cancel(job_id: str, tenant: Tenant) -> CancelResponse:
        """Cancel: a pending job leaves its queue (``cancelled``); a running one is stopped
        (``stopping``, then ``cancelled`` once its processes are gone). 409 if it has ended."""
        row_of(job_id, tenant)  # 404 before the reconciler's "already ended"
        return CancelResponse(id=job_id, state=plane.cancel(job_id, tenant))

    @app.get(
        "/v1/jobs/{job_id}/logs",
        tags=["jobs"],
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}},
    )
    def logs(
        job_id: str,
        tenant: Tenant,
        attempt: Annotated[int | None, Query(ge=1, description="default: the latest")] = None,
        rank: Annotated[int, Query(ge=0)] = 0,
        stream: Literal["out", "err"] = "out",
        offset: Annotated[int, Query(ge=0, description="byte offset, for following")] = 0,
    ) -> Response:
        """A rank's stdout or stderr from ``offset`` (at most 1 MiB a call). Headers:
        X-Log-Offset (next offset), X-Log-Size, X-Log-Attempt, X-Job-Attempt, X-Job-State."""
        row = row_of(job_id, tenant)
        n = attempt if attempt is not None else row.attempt
        data = b""
        size = 0
        # None: not started yet, no such rank / attempt, or not a plain file (the job's own
        # directory may hold links it planted; they are never followed)
        fh = plane.open_log(job_id, n, rank, stream)
        if fh is not None:
            with fh:
                size = fh.seek(0, 2)
                if offset < size:
                    fh.seek(offset)
                    data = fh.read(MAX_LOG_CHUNK)
        headers = {
            LOG_OFFSET: str(offset + len(data)),
            LOG_SIZE: str(size),
            LOG_ATTEMPT: str(n),
            JOB_ATTEMPT: str(row.attempt),
            JOB_STATE: row.state,
        }
        return Response(data, media_type="text/plain; charset=utf-8", headers=headers)

    @app.get("/v1/jobs/{job_id}/explain", tags=["jobs"])
    def explain(job_id: str, tenant: Tenant) -> dict[str, Any]:
        """Why a job waits (or runs where it runs), with its partition's fair-share table."""
        row = row_of(job_id, tenant)
        out: dict[str, Any] = {
            "id": row.id,
            "partition": row.partition,
            "queue": row.queue,
            "attempt": row.attempt,
            "fair_share": [],
        }
        live = plane.explain(job_id, tenant)
        if live is not None:
            out.update(live)
            out["scheduler_state"] = live["state"]
        out["state"] = row.state
        out["reason"] = row.reason
        out["message"] = row.message
        return out

    # ------------------------------------------------------------------ cluster
    @app.get("/v1/nodes", tags=["cluster"])
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

    @app.get("/v1/partitions", tags=["cluster"])
    def partitions(_tenant: Tenant) -> dict[str, Any]:
        """The fences: capacity, used, lent and borrowed GPUs, pending/running jobs."""
        return {"partitions": plane.partitions()}

    @app.get("/v1/events", tags=["cluster"])
    def events(
        tenant: Tenant,
        job: str | None = None,
        after: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> dict[str, Any]:
        """The decision log (seq > after): one job's for anyone who may see it, all for admins."""
        if job is not None:
            row_of(job, tenant)
        rows = plane.events(tenant, job_id=job, after_seq=after, limit=limit)
        return {"events": rows, "next_after": rows[-1]["seq"] if rows else after}

    @app.get("/v1/advice", tags=["cluster"])
    def advice(tenant: Tenant) -> dict[str, Any]:
        """Capacity advice from this control plane's own history (``gpufence advise``): for the
        admin, the spec rules with the history's numbers and every live rule; for a tenant,
        only advice about its own jobs (never another tenant's or the cluster's sizing)."""
        items = plane.advice(tenant)  # see gpufence.advice: rule, severity, evidence, fix
        return {
            "advice": [a.to_json() for a in items],
            "scope": plane.advice_scope(tenant),
            "spec": plane.advice_source,  # the cluster file the paths and lines refer to
        }

    # ------------------------------------------------------------------ open
    @app.get("/metrics", tags=["ops"], response_class=Response)
    def metrics() -> Response:
        """Prometheus exposition (unauthenticated, as scrapers expect)."""
        return Response(plane.metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict[str, Any]:
        return {"ok": True, "version": __version__}

    return app
