"""Every exception a route raises becomes one RFC 7807 problem (``problems.py``): the app's
exception handlers, all of them, in one place.

The submit front (``submission.SubmitFront``) answers an exception with the handler registered
here for its class, as FastAPI's exception middleware would; so a submit and every other route
map the same exception to the same status and detail.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

import fastapi.routing
from fastapi import FastAPI, Request, Response, status
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from gpufence.control.base.jobspec import escape
from gpufence.control.http.client import IDEMPOTENCY_KEY
from gpufence.control.http.problems import (
    FieldError,
    ProblemResponse,
    field_errors,
    problem,
    safe,
)
from gpufence.control.plane import AccessError, InvalidField
from gpufence.control.reconciler.inbox import (
    CancelError,
    IdempotencyConflict,
    NotPermitted,
    PendingCapReached,
    TenantRemoved,
)
from gpufence.control.store.errors import StoreUnavailable
from gpufence.control.store.reserve import SpaceLow

UNPROCESSABLE = 422  # starlette renamed the constant (..._CONTENT); the number is stable
log = logging.getLogger("gpufence.api")


def install_handlers(app: FastAPI) -> None:
    """Every error the app can produce becomes a Problem."""
    _install_protocol(app)
    _install_domain(app)


def _install_protocol(app: FastAPI) -> None:
    """HTTP's own errors, validation, a store that refuses writes, and anything unexpected."""

    @app.exception_handler(StarletteHTTPException)
    def _http(req: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            return _not_allowed(app, req)
        if exc.status_code == 400:  # FastAPI: a body that is not JSON (or not UTF-8)
            msg = "the body is not valid JSON text (UTF-8)"
            err = FieldError(field="body", message=msg, type="json_invalid")
            return problem(422, f"body: {msg}", errors=[err])
        headers = dict(exc.headers) if exc.headers else None
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(safe(exc.detail))
        return problem(exc.status_code, detail, headers=headers)

    @app.exception_handler(RequestValidationError)
    def _invalid(_req: Request, exc: RequestValidationError) -> ProblemResponse:
        errors = field_errors(exc.errors())
        first = f"{errors[0].field}: {errors[0].message}" if errors else "invalid request"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return problem(422, first + more, errors=errors)

    @app.exception_handler(StoreUnavailable)
    def _store(_req: Request, exc: StoreUnavailable) -> ProblemResponse:
        return problem(503, str(exc), slug="store-unavailable", headers={"Retry-After": "1"})

    @app.exception_handler(Exception)
    def _internal(req: Request, exc: Exception) -> ProblemResponse:
        log.error("%s %s failed", req.method, escape(req.url.path), exc_info=exc)
        return problem(500, "internal error; see the server log")


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method some route of ``app`` serves at ``path``, and OPTIONS.

    Starlette's own 405 names only the methods of the first route with that path (``/v1/jobs``:
    POST, though GET is served too), so every route is asked here. FastAPI keeps included
    routers whole (``iter_route_contexts`` walks through them to each route); before 0.16x it
    listed every route itself."""
    walk = getattr(fastapi.routing, "iter_route_contexts", None)
    routes: Iterable[Any] = walk(app.router.routes) if walk is not None else app.router.routes
    methods = {"OPTIONS"}
    for route in routes:
        if route.path and route.methods and compile_path(route.path)[0].match(path):
            methods |= set(route.methods)
    return sorted(methods)


def _not_allowed(app: FastAPI, req: Request) -> Response:
    """405 with an ``Allow`` naming every method of the path (RFC 9110 15.5.6); OPTIONS is
    answered, 204 with the same ``Allow`` (RFC 9110 9.3.7), without authentication: it says
    nothing but which methods exist."""
    allow = ", ".join(allowed_methods(app, req.url.path))
    if req.method == "OPTIONS":
        return Response(status_code=204, headers={"Allow": allow})
    return problem(
        405,
        f"{req.method} is not a method of this path; use one of: {allow}",
        headers={"Allow": allow},
    )


def _install_domain(app: FastAPI) -> None:
    """The control plane's refusals: another tenant's job (403), a job's state (409), a field
    the plane refused or an Idempotency-Key reused (422), the reconciler too busy (503)."""

    @app.exception_handler(AccessError)
    @app.exception_handler(TenantRemoved)  # (admin_accounts.py: removed while it submitted)
    @app.exception_handler(NotPermitted)  # a rule of who may change a job (update_writes.py)
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

    @app.exception_handler(SpaceLow)
    def _disk_full(_req: Request, exc: Exception) -> Response:
        return problem(507, str(exc), slug="disk-full", headers={"Retry-After": "10"})

    @app.exception_handler(PendingCapReached)
    def _too_many(_req: Request, exc: Exception) -> Response:
        return problem(status.HTTP_429_TOO_MANY_REQUESTS, str(exc))

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
