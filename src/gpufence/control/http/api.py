"""The HTTP API of the control plane (FastAPI): ``make_app(plane)``.

Every ``/v1`` route needs ``Authorization: Bearer <token>``: a tenant sees and cancels only its
own jobs (403 otherwise), the admin token sees everything. The web dashboard's page and assets
(``/``, ``/ui/*``: no data, the page asks for a token) are open, and so are ``/metrics``
(Prometheus) and ``/healthz``, as scrapers and load balancers expect; ``/metrics`` names
tenants, queues and jobs, so ``control.telemetry.metrics_auth: admin`` closes it to all but the
admin token where the machine's other users must not see them.

Status codes: 201 job accepted (pending or already starting); 200 the same ``Idempotency-Key``
again (the job the first request created); 422 invalid body or query (``field`` names it) *or*
a job the cluster can never hold: the scheduler rejects it at submit, ``type`` is
``urn:gpufence:problem:rejected``, ``reason`` the machine-readable reason, and the job (state
``rejected``) stays in the store so ``GET /v1/jobs/{id}`` shows it; 401 missing or bad token;
403 another tenant's job or queue; 404 unknown job; 409 cancelling an ended job; 413 a body over
``control.max_request_bytes``; 503 the store cannot take writes (``store unavailable: disk
full``) or the reconciler did not answer in time: retry. Every error is one RFC 7807 problem
document (``problems.py``).

The plane's methods block (SQLite reads, a round trip to the reconciler thread), so every route
is a plain ``def``: FastAPI runs it in its thread pool and the event loop stays free.
"""

import dataclasses
import json
import re
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request, Response, status
from fastapi.exceptions import HTTPException
from fastapi.openapi.utils import get_openapi
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import AfterValidator, BaseModel, Field

from gpufence import __version__
from gpufence.control.base.config import ADMIN
from gpufence.control.base.jobspec import MAX_NAME, SubmitRequest
from gpufence.control.base.tenantview import others_summary
from gpufence.control.http import schemas as out
from gpufence.control.http.accounting_routes import accounting_router
from gpufence.control.http.auth import (
    one_header,
    tenant_dependency,
    tenant_of_header,
    unauthorized,
)
from gpufence.control.http.body_limit import LimitBody
from gpufence.control.http.client import IDEMPOTENCY_KEY
from gpufence.control.http.dashboard_routes import dashboard_router
from gpufence.control.http.docs import install_docs
from gpufence.control.http.job_actions import install_job_actions
from gpufence.control.http.problems import (
    PROBLEM_JSON,
    FieldError,
    SafeJSONResponse,
    error_responses,
    install,
    problem,
    safe,
)
from gpufence.control.http.submission import FrontedAPI, install_submit
from gpufence.control.http.telemetry_routes import telemetry_router
from gpufence.control.plane import AccessError, ControlPlane, InvalidField
from gpufence.control.reconciler.inbox import CancelError, IdempotencyConflict
from gpufence.control.store import database as st
from gpufence.model.job import GpuRequest

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
    tasks: list[str] = Field(default_factory=list, description="an array: every task's id")


class CancelResponse(BaseModel):
    id: str
    state: str


def _gpus(spec: dict[str, Any]) -> str:
    """'2x 4 GPUs', 'mig 1g.10gb', '500m GPU' ... for tables (read from the stored spec as it
    is, without validating it again: a list of 1,000 jobs must stay cheap)."""
    try:
        if spec.get("mig") is not None:
            what = GpuRequest.mig(str(spec["mig"])).describe()
        elif spec.get("gpu_fraction") is not None:
            mem = round(float(spec.get("gpu_mem_gib") or 0.0) * 1024)
            what = GpuRequest.fraction(round(float(spec["gpu_fraction"]) * 1000), mem).describe()
        else:
            what = GpuRequest.whole(int(spec.get("gpus", 1))).describe()
        replicas = int(spec.get("replicas", 1))
    except (ValueError, TypeError, OverflowError):
        return "?"
    return f"{replicas}x {what}" if replicas != 1 else what


def job_json(row: st.JobRow) -> dict[str, Any]:
    out = row.public()
    out["seq"] = row.seq
    out["gpus"] = row.gpus if row.gpus is not None else _gpus(row.spec)
    out["name"] = row.spec.get("name")
    return out


def job_page_json(row: st.JobRow, pending: dict[str, str] | None) -> bytes:
    """One job of a list page as JSON, its stored spec text embedded as it is: a page of 1,000
    jobs is rendered without parsing and re-encoding 1,000 specs (``job_json``'s shape)."""
    text = row.spec_text
    if not text.isascii() or "NaN" in text or "Infinity" in text:  # an older store's
        out = job_json(dataclasses.replace(row, spec=json.loads(text)))
        if pending is not None:
            out["pending"] = pending
        return bytes(SafeJSONResponse(out).body)
    head = row.public()
    del head["spec"]
    head["seq"] = row.seq
    if row.gpus is not None:
        head["gpus"], head["name"] = row.gpus, row.name
    else:  # a row from before those columns existed
        spec = json.loads(text)
        head["gpus"], head["name"] = _gpus(spec), spec.get("name")
    if pending is not None:
        head["pending"] = pending
    try:
        encoded = json.dumps(head, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    except ValueError:
        encoded = json.dumps(safe(head), ensure_ascii=True, separators=(",", ":"))
    return f'{encoded[:-1]},"spec":{text}}}'.encode()


def attempt_json(att: st.AttemptRow) -> dict[str, Any]:
    return dataclasses.asdict(att)


MAX_SEQ = 2**63 - 1  # SQLite's INTEGER: a larger cursor is refused (422), not a 500
_JOB_ID = re.compile(r"j[0-9]{1,19}")


def _query_text(value: str) -> str:
    """Query strings go to SQLite: valid UTF-8, no control characters."""
    value.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError (a ValueError): 422
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
        raise ValueError("contains a control character")
    return value


QueryText = Annotated[str, Field(max_length=MAX_NAME), AfterValidator(_query_text)]


def ok(model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """The documented 200 of a route that builds its JSON itself (``schemas.py``)."""
    return {200: {"model": model, "description": "OK"}}


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document plus what the lean submit route describes by hand (its body model),
    with error responses as ``application/problem+json`` only."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    body = SubmitRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in body.pop("$defs", {}).items():
        schemas.setdefault(name, sub)
    schemas["SubmitRequest"] = body
    for ops in doc.get("paths", {}).values():
        for op in ops.values():
            for resp in op.get("responses", {}).values():
                content = resp.get("content", {})
                if PROBLEM_JSON in content:
                    content.pop("application/json", None)
    app.openapi_schema = doc
    return doc


def make_app(plane: ControlPlane) -> FrontedAPI:
    app = FrontedAPI(
        title="gpufence",
        version=__version__,
        description=(
            "Control plane of gpufence, a GPU cluster scheduler that fences training, serving, "
            "interactive and batch work. Authenticate with `Authorization: Bearer <token>`. "
            "Every error is an RFC 7807 `application/problem+json` document (`Problem`)."
        ),
        default_response_class=SafeJSONResponse,
        docs_url=None,  # served offline by install_docs
        redoc_url=None,
    )
    app.state.plane = plane
    install(app)
    app.include_router(telemetry_router(plane))  # /v1/series, /v1/jobs/{id}/latency
    app.include_router(dashboard_router(plane))  # /, /ui/*, /v1/dashboard/*
    Tenant = Annotated[str, Depends(tenant_dependency(plane.config))]

    @app.exception_handler(AccessError)
    def _forbidden(_req: Request, exc: Exception) -> Response:
        return problem(status.HTTP_403_FORBIDDEN, str(exc))

    @app.exception_handler(CancelError)
    def _conflict(_req: Request, exc: Exception) -> Response:
        return problem(status.HTTP_409_CONFLICT, str(exc))

    @app.exception_handler(InvalidField)
    def _field(_req: Request, exc: Exception) -> Response:
        loc = ".".join(exc.loc) if isinstance(exc, InvalidField) else "body"
        err = FieldError(field=loc, message=str(exc), type="invalid")
        return problem(UNPROCESSABLE, f"{loc}: {exc}", errors=[err])

    @app.exception_handler(IdempotencyConflict)
    def _key_reused(_req: Request, exc: Exception) -> Response:
        field = f"header.{IDEMPOTENCY_KEY}"
        err = FieldError(field=field, message=str(exc), type="idempotency_key_reused")
        return problem(UNPROCESSABLE, f"{field}: {exc}", errors=[err])

    @app.exception_handler(TimeoutError)
    def _busy(_req: Request, _exc: Exception) -> Response:
        return problem(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "the control plane did not answer in time; try again",
            slug="busy",
            headers={"Retry-After": "1"},
        )

    def row_of(job_id: str, tenant: str) -> st.JobRow:
        row = plane.job(job_id, tenant) if _JOB_ID.fullmatch(job_id) else None
        if row is None:  # 403 (AccessError) for another tenant's job came first
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job {job_id}")
        return row

    # ------------------------------------------------------------------ jobs
    install_submit(app, plane, job_json, SubmitResponse)
    install_job_actions(app, plane)  # hold, release, names (job_actions.py)
    app.add_middleware(LimitBody, limit=plane.config.max_request_bytes)

    @app.get(
        "/v1/jobs",
        tags=["jobs"],
        responses=ok(out.JobList) | error_responses(401, 403, 422, 503),
        response_model=None,
    )
    def list_jobs(
        tenant: Tenant,
        state: Annotated[
            list[Literal[st.STATES]] | None,  # type: ignore[valid-type]
            Query(description=f"repeatable; one of {', '.join(st.STATES)}"),
        ] = None,
        partition: QueryText | None = None,
        tenant_filter: Annotated[
            QueryText | None, Query(alias="tenant", description="admin: one tenant's jobs")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
        after: Annotated[
            int, Query(ge=0, le=MAX_SEQ, description="return jobs with seq > after")
        ] = 0,
    ) -> Any:
        """Jobs in submission order; a tenant sees only its own. Pending jobs carry why."""
        states = tuple(state or ())
        rows = plane.jobs(
            tenant,
            states=states,
            partition=partition,
            only_tenant=tenant_filter,
            limit=limit,
            after_seq=after,
            parse_spec=False,
        )
        pending_ids = [r.id for r in rows if r.state == st.PENDING]
        why = plane.pending_reasons(pending_ids, tenant) if pending_ids else {}
        parts = [job_page_json(r, why.get(r.id)) for r in rows]
        tail = f'],"next_after":{rows[-1].seq if rows else after}}}'.encode()
        return Response(b'{"jobs":[' + b",".join(parts) + tail, media_type="application/json")

    @app.get(
        "/v1/jobs/{job_id}",
        tags=["jobs"],
        responses=ok(out.JobDetail) | error_responses(401, 403, 404, 422, 503),
        response_model=None,
    )
    def get_job(job_id: str, tenant: Tenant) -> dict[str, Any]:
        """One job, its attempts (devices, exit codes) and, while pending, why."""
        row = row_of(job_id, tenant)
        out = job_json(row)
        out["attempts"] = [attempt_json(a) for a in plane.attempts(job_id)]
        if row.state == st.PENDING:
            out["pending"] = plane.pending_reasons([job_id], tenant).get(job_id)
        return out

    @app.post(
        "/v1/jobs/{job_id}/cancel",
        response_model=CancelResponse,
        tags=["jobs"],
        responses=error_responses(401, 403, 404, 409, 413, 422, 503),
    )
    def cancel(job_id: str, tenant: Tenant) -> CancelResponse:
        """Cancel: a pending job leaves its queue (``cancelled``); a running one is stopped
        (``stopping``, then ``cancelled`` once its processes are gone). 409 if it has ended."""
        row_of(job_id, tenant)  # 404 before the reconciler's "already ended"
        return CancelResponse(id=job_id, state=plane.cancel(job_id, tenant))

    @app.get(
        "/v1/jobs/{job_id}/logs",
        tags=["jobs"],
        response_class=Response,
        responses={
            200: {
                "description": "the bytes (UTF-8 text as the job wrote it)",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            },
            **error_responses(401, 403, 404, 422, 503),
        },
    )
    def logs(
        job_id: str,
        tenant: Tenant,
        attempt: Annotated[
            int | None, Query(ge=1, le=1_000_000, description="default: the latest")
        ] = None,
        rank: Annotated[int, Query(ge=0, le=65_535)] = 0,
        stream: Literal["out", "err"] = "out",
        offset: Annotated[
            int, Query(ge=0, le=MAX_SEQ, description="byte offset, for following")
        ] = 0,
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

    @app.get(
        "/v1/jobs/{job_id}/explain",
        tags=["jobs"],
        responses=ok(out.Explanation) | error_responses(401, 403, 404, 422, 503),
        response_model=None,
    )
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
    @app.get(
        "/v1/nodes",
        tags=["cluster"],
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

    @app.get(
        "/v1/partitions",
        tags=["cluster"],
        responses=ok(out.PartitionList) | error_responses(401, 503),
        response_model=None,
    )
    def partitions(_tenant: Tenant) -> dict[str, Any]:
        """The fences: capacity, used, lent and borrowed GPUs, pending/running jobs."""
        return {"partitions": plane.partitions()}

    @app.get(
        "/v1/events",
        tags=["cluster"],
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
            row_of(job, tenant)
        rows = plane.events(tenant, job_id=job, after_seq=after, limit=limit)
        return {"events": rows, "next_after": rows[-1]["seq"] if rows else after}

    @app.get(
        "/v1/advice",
        tags=["cluster"],
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

    # ------------------------------------------------------------------ open
    @app.get(
        "/metrics",
        tags=["ops"],
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

    @app.get("/healthz", tags=["ops"], response_model=out.Health)
    def healthz() -> dict[str, Any]:
        """Liveness, and whether the store takes writes (``store``: ``ok`` or the reason)."""
        why = plane.store.problem()
        return {"ok": True, "version": __version__, "store": why or "ok"}

    @app.get(
        "/readyz",
        tags=["ops"],
        response_model=out.Health,
        responses=error_responses(503),
    )
    def readyz() -> Any:
        """Readiness: 200 while the store takes writes, else 503 with why (a load balancer or a
        probe sends no submits then); ``/healthz`` stays 200 while the process lives."""
        why = plane.store.problem()
        if why is not None:
            return problem(503, why, slug="store-unavailable", headers={"Retry-After": "1"})
        return {"ok": True, "version": __version__, "store": "ok"}

    app.include_router(accounting_router(plane))
    install_docs(app)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app
