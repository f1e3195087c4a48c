"""``POST /v1/jobs``: the one route on the hot path, kept lean. One handler, ``submit``.

``submit`` is an ordinary FastAPI route, registered once (``submit_router``): OpenAPI describes
it (``SUBMIT_DOC``: the body and the header it reads itself) and FastAPI's routing serves it
whenever a request reaches it that way. Its hot path does not go that way: ``FrontedAPI`` hands
``POST /v1/jobs`` to ``SubmitFront`` ahead of FastAPI's own machinery, and the front calls that
same endpoint. Why not only the plain route: FastAPI's routing, dependency solving, middleware
stack and per-request telemetry probe cost more than everything else a submit does (on a small
machine: the difference between hundreds and a thousand submits a second, ``bench/README.md``).
So there is one place that reads, validates and answers a submit, and it is the one OpenAPI
describes; the front adds only what the middleware it skips would have done.

The behaviour is the API's: bearer auth (401), the body validated as ``SubmitRequest`` (422
naming the field), ``Idempotency-Key``, 403 for another tenant's queue, 503 when the store
refuses the write; an exception becomes the response the app's exception handlers
(``handlers.py``) make of it. The answer is awaited on the event loop (the reconciler's
future), not in a worker thread.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response, status
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.http.auth import SEVERAL_HEADERS, tenant_of_header
from gpufence.control.http.body_limit import (
    non_json_type,
    read_body,
    refuse,
    refuse_type,
    too_long,
)
from gpufence.control.http.client import IDEMPOTENCY_KEY, IDEMPOTENCY_KEY_PATTERN
from gpufence.control.http.jobs_routes import job_json
from gpufence.control.http.problems import (
    FieldError,
    SafeJSONResponse,
    error_responses,
    field_errors,
    problem,
)
from gpufence.control.http.replybox import reply_box
from gpufence.control.plane import CALL_TIMEOUT_S, ControlPlane
from gpufence.control.reconciler.inbox import SubmitResult
from gpufence.control.store import database as st

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
    if "give cpus" in message:
        return "body.cpus"
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


class SubmitResponse(BaseModel):
    state: str
    reason: str = ""
    message: str = ""
    id: str = Field(description="the job's id; an array's own id (j4: its tasks are j4_0, ...)")
    tasks: list[str] = Field(default_factory=list, description="an array: every task's id")


_ANSWER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # built once, not per call
SUBMIT_PATH = "/v1/jobs"
Endpoint = Callable[[Request], Awaitable[Response]]


def _parse(raw: bytes) -> SubmitRequest | Response:
    """The body as a ``SubmitRequest``, or the 422 naming what is wrong with it."""
    try:
        # decoded as UTF-8 first: json.loads of bytes would also take UTF-16/32 and a BOM
        obj = json.loads(raw.decode("utf-8"))
    except ValueError:  # also a body that is not UTF-8
        return _invalid("body", "the body is not valid JSON text (UTF-8)", "json_invalid")
    except RecursionError:  # '[[[[...' nested ~1000 deep: the decoder's stack, not a 500
        return _invalid("body", "the body's JSON is nested too deeply", "json_invalid")
    try:
        return SubmitRequest.model_validate(obj)
    except ValidationError as exc:
        errors = field_errors(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        )
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return problem(
            UNPROCESSABLE, f"{errors[0].field}: {errors[0].message}{more}", errors=errors
        )


def _accepted(res: SubmitResult) -> Response:
    """201 (200: the same Idempotency-Key again) with the job's id and state."""
    body: dict[str, Any] = {
        "id": res.array or res.job_id,
        "state": res.state,
        "reason": res.reason,
        "message": res.message,
    }
    if res.tasks:  # an array: every task's id
        body["tasks"] = list(res.tasks)
    code = status.HTTP_200_OK if res.replayed else status.HTTP_201_CREATED
    try:
        encoded = _ANSWER.encode(body).encode()
    except UnicodeEncodeError:  # a message with a lone surrogate: escaped, never a 500
        return SafeJSONResponse(body, status_code=code)
    return Response(encoded, status_code=code, media_type="application/json")


async def _rejected(
    plane: ControlPlane, req: SubmitRequest, tenant: str, res: SubmitResult
) -> Response:
    """The scheduler's reject: 422 ``rejected``, with the job as stored."""
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


def _headers(raw: Iterable[tuple[bytes, bytes]]) -> tuple[str | None, str | None]:
    """``Authorization`` and ``Idempotency-Key``, read in one pass over the raw headers (ASGI
    names them in lower case): ``one_header(request.headers.getlist(...))`` twice, for a few
    microseconds less on the hot path. A header sent twice is read by nobody
    (``auth.SEVERAL_HEADERS``)."""
    authorization = key = None
    for name, value in raw:
        if name == b"authorization":
            authorization = (
                SEVERAL_HEADERS if authorization is not None else value.decode("latin-1")
            )
        elif name == b"idempotency-key":
            key = SEVERAL_HEADERS if key is not None else value.decode("latin-1")
    return authorization, key


def submit_router(plane: ControlPlane) -> APIRouter:
    """The route ``POST /v1/jobs``: ``submit``, which ``SubmitFront`` also serves."""
    router = APIRouter(tags=["jobs"])

    @router.post(
        SUBMIT_PATH,
        status_code=status.HTTP_201_CREATED,
        response_model=SubmitResponse,
        responses={
            200: {"model": SubmitResponse, "description": "the same Idempotency-Key again"},
            **error_responses(401, 403, 413, 422, 429, 503, 507),
        },
        openapi_extra=SUBMIT_DOC,
    )
    async def submit(request: Request) -> Response:
        """Submit a job (body: ``SubmitRequest``). A job that no partition can ever hold is
        rejected here, with why. With an Idempotency-Key, retrying after a lost answer
        (timeout, crash) is safe."""
        # it reads its headers and body itself (SUBMIT_DOC documents them): FastAPI's own
        # validation would answer with other 422s than the API's, and cost the hot path
        authorization, key = _headers(request.scope["headers"])
        tenant = tenant_of_header(plane.config, authorization)
        if key == SEVERAL_HEADERS:
            return _invalid(
                f"header.{IDEMPOTENCY_KEY}", "send one Idempotency-Key, not several", "several"
            )
        if key is not None and not IDEMPOTENCY_KEY_PATTERN.fullmatch(key):
            return _invalid(
                f"header.{IDEMPOTENCY_KEY}", "must be 1-255 visible ASCII characters", "pattern"
            )
        req = _parse(await request.body())
        if isinstance(req, Response):
            return req
        fut = plane.submit_future(req, tenant, key)
        # on timeout the future is cancelled, which the reconciler takes as "the caller gave
        # up" (inbox.reply): the submit still lands
        res = await reply_box().result(fut, CALL_TIMEOUT_S, "no answer from the reconciler")
        if res.state == st.REJECTED:
            return await _rejected(plane, req, tenant, res)
        return _accepted(res)

    return router


class _ReadRequest(Request):
    """The request as the endpoint sees it, its body already read by the front (to hold it to
    the size limit): handed over as it is, not streamed a second time."""

    def __init__(self, scope: Scope, body: bytes) -> None:
        super().__init__(scope)
        self._read = body

    async def body(self) -> bytes:
        return self._read


class SubmitFront:
    """``POST /v1/jobs``, answered ahead of FastAPI (``FrontedAPI`` hands it the request) by
    the route's own endpoint (``submit_router``'s ``submit``).

    It does what the middleware it skips would have done for this route: the request-size
    limit (413, ``body_limit.py``), and, wrapped in Starlette's ``ServerErrorMiddleware`` with
    the app's own 500 handler, an unexpected exception is still the 500 problem, logged; the
    exceptions a submit raises on purpose are answered by the handler the app registered for
    their class, as FastAPI's exception middleware would have."""

    def __init__(self, endpoint: Endpoint, api: FastAPI, limit: int) -> None:
        self.endpoint = endpoint
        self.api = api
        self.limit = limit
        self._guarded: ASGIApp | None = None

    @classmethod
    def of(cls, router: APIRouter, api: FastAPI, limit: int) -> SubmitFront:
        """The front of the submit route ``router`` registered (``submit_router``'s)."""
        return cls(_submit_endpoint(router.routes), api, limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._guarded is None:  # the app's handlers are all registered by the first request
            handler = self.api.exception_handlers.get(500) or self.api.exception_handlers.get(
                Exception
            )
            self._guarded = ServerErrorMiddleware(self._serve, handler, self.api.debug)
        await self._guarded(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        for name, value in scope["headers"]:
            if name == b"content-length" and too_long(value, self.limit):
                await refuse(scope, receive, send, self.limit)
                return
        kind = non_json_type(scope["headers"])
        if kind is not None:
            await refuse_type(scope, receive, send, kind)
            return
        body, complete = await read_body(receive, self.limit)
        if complete is None:
            await refuse(scope, receive, send, self.limit)
            return
        if not complete:
            return  # the client went away: nothing was submitted
        try:
            response = await self.endpoint(_ReadRequest(scope, body))
        except Exception as exc:
            response = await self._handled(scope, exc)
        await response(scope, receive, send)

    async def _handled(self, scope: Scope, exc: Exception) -> Response:
        """The response of the app's handler for ``exc``'s class; re-raised if it has none
        but the catch-all (``ServerErrorMiddleware`` answers 500 and logs it)."""
        for cls in type(exc).__mro__:
            if cls is Exception:
                break
            handler = self.api.exception_handlers.get(cls)
            if handler is not None:
                out = handler(Request(scope), exc)
                if inspect.isawaitable(out):
                    out = await out
                assert isinstance(out, Response)
                return out
        raise exc


def _submit_endpoint(routes: list[BaseRoute]) -> Endpoint:
    for route in routes:
        if (
            isinstance(route, APIRoute)
            and route.path == SUBMIT_PATH
            and "POST" in (route.methods or ())
        ):
            endpoint: Endpoint = route.endpoint
            return endpoint
    raise LookupError(f"no route POST {SUBMIT_PATH}")


class FrontedAPI(FastAPI):
    """FastAPI with ``POST /v1/jobs`` handed to its ``SubmitFront`` before any of FastAPI's own
    machinery (its telemetry probe, body limit and middleware stack cost more per request than
    a submit's own work); every other request goes the usual way."""

    submit_front: SubmitFront | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        front = self.submit_front
        if (
            front is not None
            and scope["type"] == "http"
            and scope["path"] == SUBMIT_PATH
            and scope["method"] == "POST"
        ):
            await front(scope, receive, send)
            return
        await super().__call__(scope, receive, send)
