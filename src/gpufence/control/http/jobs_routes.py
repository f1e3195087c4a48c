"""The job routes but submit (``submission.py``): list, one job, cancel, logs, explain.

A tenant sees and cancels only its own jobs (403 for another tenant's, 404 for an unknown one);
the admin token sees everything. The plane's methods block (SQLite reads, a round trip to the
reconciler thread), so every route is a plain ``def``: FastAPI runs it in its thread pool and
the event loop stays free.

No ``from __future__ import annotations``: FastAPI resolves the routes' local ``Annotated``
aliases at definition time.
"""

import dataclasses
import json
import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Response, status
from fastapi.exceptions import HTTPException
from pydantic import AfterValidator, BaseModel, Field

from gpufence.control.base.jobspec import MAX_NAME, NO_CONTROL_PATTERN
from gpufence.control.http import schemas as out
from gpufence.control.http.auth import tenant_dependency
from gpufence.control.http.problems import SafeJSONResponse, error_responses, safe
from gpufence.control.http.schemas import ok
from gpufence.control.plane import ControlPlane
from gpufence.control.store import database as st
from gpufence.control.store import names
from gpufence.model.job import GpuRequest

MAX_LOG_CHUNK = 1 << 20
"""Bytes of log one request returns at most; the client pages with ``offset``."""

# response headers of GET /v1/jobs/{id}/logs
LOG_OFFSET = "X-Log-Offset"  # where the next read starts
LOG_SIZE = "X-Log-Size"  # the file's size when read
JOB_STATE = "X-Job-State"  # lets `logs -f` stop when the job has ended
LOG_ATTEMPT = "X-Log-Attempt"  # the attempt these bytes are from
JOB_ATTEMPT = "X-Job-Attempt"  # the job's latest attempt (a follower switches to it)


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


QueryText = Annotated[
    str,
    Field(max_length=MAX_NAME, json_schema_extra={"pattern": NO_CONTROL_PATTERN}),
    AfterValidator(_query_text),
]


def row_of(plane: ControlPlane, job_id: str, tenant: str) -> st.JobRow:
    """The job's row, 404 if there is none (403, ``AccessError``, for another tenant's job
    comes first, from the plane)."""
    row = plane.job(job_id, tenant) if _JOB_ID.fullmatch(job_id) else None
    if row is None:
        why = _array(plane, job_id, tenant)
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job {job_id}{why}")
    return row


def _array(plane: ControlPlane, ref: str, tenant: str) -> str:
    """Why an array's id is no job here, and where its tasks are ("" for no array's)."""
    if not _JOB_ID.fullmatch(ref):
        return ""
    try:
        with plane.store.reader() as r:
            tasks = r.resolve_ref(tenant, ref)  # no job has the id: its array's tasks, if any
    except names.UnknownJob:
        return ""
    return (
        f": {ref} is an array of {len(tasks)} task(s), {tasks[0].id}..{tasks[-1].id} "
        f"(GET /v1/names/{ref} lists them; the CLI takes {ref} for every task)"
    )


def read_log(
    plane: ControlPlane, row: st.JobRow, attempt: int | None, rank: int, stream: str, offset: int
) -> Response:
    """``logs``' answer: at most ``MAX_LOG_CHUNK`` bytes from ``offset``, with the headers a
    follower pages and stops with."""
    n = attempt if attempt is not None else row.attempt
    data = b""
    size = 0
    # None: not started yet, no such rank / attempt, or not a plain file (the job's own
    # directory may hold links it planted; they are never followed)
    fh = plane.open_log(row.id, n, rank, stream)
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


def jobs_router(plane: ControlPlane) -> APIRouter:
    """``GET /v1/jobs``, ``GET /v1/jobs/{id}``, ``POST /v1/jobs/{id}/cancel``, and
    ``_reads_router``'s routes (logs, explain)."""
    router = APIRouter()
    Tenant = Annotated[str, Depends(tenant_dependency(plane.config))]

    @router.get(
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

    @router.get(
        "/v1/jobs/{job_id}",
        tags=["jobs"],
        responses=ok(out.JobDetail) | error_responses(401, 403, 404, 422, 503),
        response_model=None,
    )
    def get_job(job_id: str, tenant: Tenant) -> dict[str, Any]:
        """One job, its attempts (devices, exit codes) and, while pending, why."""
        row = row_of(plane, job_id, tenant)
        out = job_json(row)
        out["attempts"] = [attempt_json(a) for a in plane.attempts(job_id)]
        if row.state == st.PENDING:
            out["pending"] = plane.pending_reasons([job_id], tenant).get(job_id)
        return out

    @router.post(
        "/v1/jobs/{job_id}/cancel",
        tags=["jobs"],
        response_model=CancelResponse,
        responses=error_responses(401, 403, 404, 409, 413, 422, 503),
    )
    def cancel(job_id: str, tenant: Tenant) -> CancelResponse:
        """Cancel: a pending job leaves its queue (``cancelled``); a running one is stopped
        (``stopping``, then ``cancelled`` once its processes are gone). 409 if it has ended."""
        row_of(plane, job_id, tenant)  # 404 before the reconciler's "already ended"
        return CancelResponse(id=job_id, state=plane.cancel(job_id, tenant))

    router.include_router(_reads_router(plane))
    return router


def _reads_router(plane: ControlPlane) -> APIRouter:
    """A job's logs and its explanation (apart from ``jobs_router`` only to keep each function
    short)."""
    router = APIRouter()
    Tenant = Annotated[str, Depends(tenant_dependency(plane.config))]

    @router.get(
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
        return read_log(plane, row_of(plane, job_id, tenant), attempt, rank, stream, offset)

    @router.get(
        "/v1/jobs/{job_id}/explain",
        tags=["jobs"],
        responses=ok(out.Explanation) | error_responses(401, 403, 404, 422, 503),
        response_model=None,
    )
    def explain(job_id: str, tenant: Tenant) -> dict[str, Any]:
        """Why a job waits (or runs where it runs), with its partition's fair-share table."""
        row = row_of(plane, job_id, tenant)
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

    return router
