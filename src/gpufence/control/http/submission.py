"""``POST /v1/jobs``: the one route on the hot path, kept lean.

It reads its headers and body itself instead of through FastAPI's dependency injection, which
costs more per request than everything else a submit does (on a small machine: the difference
between hundreds and a thousand submits a second). The behaviour is the API's: bearer auth
(401), the body validated as ``SubmitRequest`` (422 naming the field), ``Idempotency-Key``, 403
for another tenant's queue, 503 when the store refuses the write, and the OpenAPI document
describes all of it (``SUBMIT_DOC``). The answer is awaited on the event loop (the reconciler's
future), not in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from fastapi import FastAPI, Request, Response, status
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from gpufence.control.http.auth import tenant_of_header
from gpufence.control.http.problems import (
    FieldError,
    SafeJSONResponse,
    error_responses,
    field_errors,
    problem,
)
from gpufence.control.inbox import SubmitResult
from gpufence.control.jobspec import SubmitRequest
from gpufence.control.plane import CALL_TIMEOUT_S, ControlPlane
from gpufence.control.store import database as st

IDEMPOTENCY_KEY = "Idempotency-Key"
_KEY = re.compile(r"[\x21-\x7e]{1,255}")
UNPROCESSABLE = 422

SUBMIT_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SubmitRequest"}}},
    },
    "parameters": [
        {
            "name": IDEMPOTENCY_KEY,
            "in": "header",
            "required": False,
            "description": "any 1-255 visible ASCII characters, unique per job (a UUID): a "
            "repeat with the same key returns the job the first request created (200)",
            "schema": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,255}$"},
        }
    ],
    "security": [{"HTTPBearer": []}],
}


def _invalid(field: str, message: str, kind: str) -> Response:
    return problem(
        UNPROCESSABLE,
        f"{field}: {message}",
        errors=[FieldError(field=field, message=message, type=kind)],
    )


def _reject_field(req: SubmitRequest, reason: str, message: str) -> str:
    """Best guess at the field a scheduler reject is about."""
    if "queue" in message and req.queue:
        return "body.queue"
    if "partition '" in message and req.partition:
        return "body.partition"
    if "gpus per replica" in message:
        return "body.gpus"
    if "CPU/memory" in message:
        return "body.cpus" if req.cpus is not None else "body.mem_bytes"
    if reason == "never-fits":
        if req.mig is not None:
            return "body.mig"
        if req.gpu_fraction is not None:
            return "body.gpu_mem_gib" if "MiB" in message else "body.gpu_fraction"
        if "gang needs" in message:
            return "body.replicas"
        return "body.gpus"
    return "body"


def install_submit(app: FastAPI, plane: ControlPlane, job_json: Any, response_model: Any) -> None:
    @app.post(
        "/v1/jobs",
        status_code=status.HTTP_201_CREATED,
        response_model=response_model,
        tags=["jobs"],
        responses={
            200: {"model": response_model, "description": "the same Idempotency-Key again"},
            **error_responses(401, 403, 413, 422, 503),
        },
        openapi_extra=SUBMIT_DOC,
    )
    async def submit(request: Request) -> Response:
        """Submit a job (body: ``SubmitRequest``). A job that no partition can ever hold is
        rejected here, with why. With an Idempotency-Key, retrying after a lost answer
        (timeout, crash) is safe."""
        tenant = tenant_of_header(plane.config, request.headers.get("authorization"))
        key = request.headers.get(IDEMPOTENCY_KEY)
        if key is not None and not _KEY.fullmatch(key):
            return _invalid(
                f"header.{IDEMPOTENCY_KEY}", "must be 1-255 visible ASCII characters", "pattern"
            )
        raw = await request.body()
        try:
            obj = json.loads(raw)
        except ValueError:  # also a body that is not UTF-8
            return _invalid("body", "the body is not valid JSON text (UTF-8)", "json_invalid")
        try:
            req = SubmitRequest.model_validate(obj)
        except ValidationError as exc:
            errors = field_errors(
                [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
            )
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            return problem(
                UNPROCESSABLE, f"{errors[0].field}: {errors[0].message}{more}", errors=errors
            )
        fut = plane.submit_future(req, tenant, key)
        try:
            res: SubmitResult = await asyncio.wait_for(asyncio.wrap_future(fut), CALL_TIMEOUT_S)
        except TimeoutError:
            raise TimeoutError("no answer from the reconciler") from None
        if res.state != st.REJECTED:
            body = {
                "id": res.job_id,
                "state": res.state,
                "reason": res.reason,
                "message": res.message,
            }
            code = status.HTTP_200_OK if res.replayed else status.HTTP_201_CREATED
            return SafeJSONResponse(body, status_code=code)
        row = await run_in_threadpool(plane.job, res.job_id, tenant)
        msg = res.message or res.reason
        job = job_json(row) if row is not None else {"id": res.job_id, "state": res.state}
        field = _reject_field(req, res.reason, res.message)
        return problem(
            UNPROCESSABLE,
            msg,
            slug="rejected",
            title="Rejected by the scheduler",
            errors=[FieldError(field=field, message=msg, type="rejected")],
            reason=res.reason,
            job=job,
        )
