"""One error shape for the whole API: RFC 7807 ``application/problem+json``.

Every error response is a ``Problem``: ``type`` (a URN naming the kind), ``title`` (the kind in
words), ``status``, ``detail`` (what happened and what to do) and, for 422, ``field`` (the first
offending field as a dotted path, e.g. ``body.est_runtime_s``) and ``errors`` (every field). A job
the scheduler rejects at submit adds ``reason`` and the stored ``job``. ``handlers.py`` turns
every exception the routes raise into one; ``error_responses`` documents them in the OpenAPI.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from gpufence.control.base.jobspec import escape
from gpufence.control.http.schemas import JSONValue

PROBLEM_JSON = "application/problem+json"

TITLES = {
    400: ("bad-request", "Bad request"),
    401: ("unauthorized", "Missing or invalid token"),
    403: ("forbidden", "Not allowed for this tenant"),
    404: ("not-found", "No such resource"),
    405: ("method-not-allowed", "Method not allowed"),
    409: ("conflict", "Conflicts with the job's state"),
    413: ("too-large", "Request body too large"),
    422: ("invalid", "Invalid request"),
    429: ("too-many-pending", "Too many pending jobs"),
    500: ("internal", "Internal error"),
    503: ("unavailable", "Service unavailable"),
    507: ("disk-full", "The data directory's disk is full"),
}


class FieldError(BaseModel):
    field: str = Field(description="dotted path: body.env.FOO, query.after, path.job_id")
    message: str
    type: str = Field(description="machine-readable kind, e.g. greater_than, finite_number")


class Problem(BaseModel):
    """An RFC 7807 problem document (``application/problem+json``)."""

    type: str = Field(description="URN of the problem kind, e.g. urn:gpufence:problem:invalid")
    title: str
    status: int
    detail: str
    field: str | None = Field(default=None, description="422: the first offending field")
    errors: list[FieldError] = Field(default_factory=list, description="422: every field")
    reason: str | None = Field(default=None, description="scheduler reject: its reason")
    job: dict[str, JSONValue] | None = Field(
        default=None, description="scheduler reject: the job as stored (JobSummary's fields)"
    )


def problem_type(slug: str) -> str:
    return f"urn:gpufence:problem:{slug}"


def safe(value: Any) -> Any:
    """JSON-safe copy: no lone surrogates, no non-finite floats (written by older versions)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {safe(k): safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [safe(v) for v in value]
    return value


class SafeJSONResponse(JSONResponse):
    """JSONResponse that never fails to encode: stored text that is not valid UTF-8 or numbers
    that are not finite (from before input was validated) come out escaped / null, not a 500."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except (UnicodeEncodeError, ValueError):
            return json.dumps(safe(content), ensure_ascii=False, separators=(",", ":")).encode()


class ProblemResponse(SafeJSONResponse):
    media_type = PROBLEM_JSON


def problem(
    status: int,
    detail: str,
    *,
    slug: str | None = None,
    title: str | None = None,
    errors: Sequence[FieldError] = (),
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> ProblemResponse:
    kind, default_title = TITLES.get(status, ("error", "Error"))
    body = Problem(
        type=problem_type(slug or kind),
        title=title or default_title,
        status=status,
        detail=escape_detail(detail),
        field=errors[0].field if errors else None,
        errors=list(errors),
        **extra,
    )
    return ProblemResponse(
        body.model_dump(mode="json", exclude_none=True), status_code=status, headers=headers
    )


def escape_detail(text: str) -> str:
    """User text echoed in a detail: no surrogates (unencodable), no terminal escapes."""
    return escape(text) if not (text.isascii() and text.isprintable()) else text


def field_errors(errors: Sequence[Any]) -> list[FieldError]:
    out = []
    for e in errors:
        loc = ".".join(str(p) for p in e.get("loc", ()))
        out.append(
            FieldError(
                field=escape_detail(loc),
                # our validators' own words, without pydantic's "Value error, " in front
                message=escape_detail(str(e.get("msg", "")).removeprefix("Value error, ")),
                type=str(e.get("type", "invalid")),
            )
        )
    return out


_DESCRIPTIONS = {
    401: "missing or invalid bearer token",
    403: "another tenant's job or queue",
    404: "no such job (or route)",
    409: "conflicts with the job's state (e.g. cancelling an ended job)",
    413: "request body larger than control.max_request_bytes (default 1 MiB)",
    422: "invalid request: `field` names the first offending field, `errors` all of them",
    429: "the tenant's pending jobs would pass its cap (control.max_pending_jobs); the detail "
    "names the cap and the fix",
    507: "the data directory's disk is full: new jobs are refused while cancels and exits "
    "land in the store's reserve (control.store_reserve_mib)",
    503: "store unavailable (disk full, read-only, I/O error) or the control plane is busy; "
    "retry (POST /v1/jobs with the same Idempotency-Key)",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these status codes, all with the Problem shape."""
    return {
        code: {
            "description": _DESCRIPTIONS[code],
            "model": Problem,
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for code in codes
    }


ERRORS_ALL = (401, 403, 404, 409, 413, 422, 503)
