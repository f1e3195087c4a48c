"""The API's documents: ``/openapi.json`` (``install_openapi``) and the offline pages ``/docs``
(Swagger UI) and ``/redoc``, with their assets served by the server itself, never from a CDN,
so they render on a machine with no internet.

The assets (Swagger UI 5, which renders OpenAPI 3.1, and ReDoc's standalone bundle) come from
the ``fastapi-offline`` package (a dependency of the ``server`` extra): only its static files
are used, through FastAPI's own page builders, so the app stays a plain ``FastAPI``. They are
served under ``/docs-assets/`` without authentication, like the docs pages themselves.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.http.problems import PROBLEM_JSON

ASSETS_URL = "/docs-assets"
ASSET_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")


def assets_dir() -> Path:
    return Path(str(resources.files("fastapi_offline") / "static"))


def install_docs(app: FastAPI) -> None:
    """``/docs`` and ``/redoc`` on ``app`` (created with ``docs_url=None, redoc_url=None``)."""
    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document plus what the lean submit route describes by hand (its body model),
    with error responses as ``application/problem+json`` only."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    body = json_schema_bounds(
        SubmitRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    )
    # set by gpufence on each task of an array, refused from a client: not in the request's
    # document (it keeps its own schema, ArrayTask, for the jobs read back)
    body["properties"].pop("array_task", None)
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


_BOUNDS = {"gt": "exclusiveMinimum", "ge": "minimum", "lt": "exclusiveMaximum", "le": "maximum"}


def json_schema_bounds(schema: Any) -> Any:
    """``schema`` with pydantic's own names of numeric bounds (``gt``, ``le``...), which it
    writes for a constrained number whose type carries a validator of its own (``jobspec.Int``,
    ``Float``), as JSON Schema's: no client or fuzzer reads ``le``, so a limit the server
    enforces was missing from the document (``time_limit_s`` up to 1e10 looked valid)."""
    if isinstance(schema, list):
        return [json_schema_bounds(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    numeric = schema.get("type") in ("number", "integer")
    return {
        (_BOUNDS[k] if numeric and k in _BOUNDS else k): json_schema_bounds(v)
        for k, v in schema.items()
    }


def install_openapi(app: FastAPI) -> None:
    """``app``'s ``/openapi.json`` is ``_openapi``'s document (built once, on first use)."""
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
