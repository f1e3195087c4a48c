"""Bearer-token authentication for the HTTP API.

``Authorization: Bearer <token>`` maps to a tenant name through ``ControlConfig.tenant_of``
(``"admin"`` for the admin token). A missing or unknown token is a 401 with
``WWW-Authenticate: Bearer``. Tokens are never logged: the 401 says *that* the token is wrong,
not what it was, and the uvicorn access log records the request line only (no headers).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gpufence.control.base.config import ControlConfig

# auto_error=False: FastAPI's own error for a missing header is a 403 in some versions; a
# missing credential is a 401 here, always with the challenge header.
bearer = HTTPBearer(
    auto_error=False,
    description="the admin token (DATA/admin.token or control.auth.admin_token) or a tenant token",
)

CHALLENGE = {"WWW-Authenticate": "Bearer"}


def unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail=detail, headers=CHALLENGE)


SEVERAL_HEADERS = "\x00several"
"""Stands for a header sent more than once (no header value has a NUL): refused, never read,
since one route reading the first and another the last would let a request be two tenants
(``Authorization``) or two submits (``Idempotency-Key``)."""
SEVERAL = "send one Authorization header, not several"


def one_header(values: Sequence[str]) -> str | None:
    """The header's value, None if absent, ``SEVERAL_HEADERS`` if sent more than once."""
    if len(values) > 1:
        return SEVERAL_HEADERS
    return values[0] if values else None


def tenant_of_header(config: ControlConfig, authorization: str | None) -> str:
    """The tenant of an ``Authorization`` header value (401 if missing or unknown): the same
    rules as the dependency, for routes that read their headers themselves."""
    if authorization == SEVERAL_HEADERS:
        raise unauthorized(SEVERAL)
    scheme, _, token = (authorization or "").partition(" ")
    if not token or scheme.lower() != "bearer":
        raise unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    token = token.strip()
    name = config.tenant_of(token) if token.isascii() else None
    if name is None:
        raise unauthorized(config.token_refusal(token) if token.isascii() else "invalid token")
    return name


def tenant_dependency(config: ControlConfig) -> Callable[..., Awaitable[str]]:
    """A FastAPI dependency returning the caller's tenant ("admin" for the admin token)."""

    async def tenant(  # async: no worker thread for a dictionary lookup
        request: Request,
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> str:
        if one_header(request.headers.getlist("authorization")) == SEVERAL_HEADERS:
            raise unauthorized(SEVERAL)
        if creds is None:
            raise unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
        token = creds.credentials
        # compare_digest refuses non-ASCII str; no configured token contains any
        name = config.tenant_of(token) if token.isascii() else None
        if name is None:  # expired, revoked, rotated out, of a removed tenant: say which
            raise unauthorized(config.token_refusal(token) if token.isascii() else "invalid token")
        return name

    return tenant
