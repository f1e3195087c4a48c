"""The web dashboard (included by ``api.make_app``): its page, its assets, and the few read-only
routes it needs beyond the API's own.

* ``GET /`` — the single page (``dashboard/index.html``); ``GET /ui/{name}`` — its scripts and
  styles. They hold no data and no secret, so they are served without a token; every number on
  the page comes from ``/v1`` routes called with ``Authorization: Bearer <token>``. The page
  asks for the token in a form, keeps it in the tab's ``sessionStorage`` (gone when the tab
  closes, never in a URL, so never in an access log, a referrer or the history) and sends it as
  that header. A Content-Security-Policy of ``'self'`` only keeps other origins' scripts out.
* ``GET /v1/dashboard/whoami`` — who the token is (the sign-in check).
* ``GET /v1/dashboard/queue`` — one page of jobs with the number that match, filtered by state,
  partition, queue, tenant and class; pending jobs carry their reason sentence.
* ``GET /v1/dashboard/fairshare`` — every partition's fair-share table (as ``explain`` shows it).
* ``GET /v1/dashboard/gpus`` — ``/v1/nodes`` plus what the GPU map colours and labels: each
  shown job's tenant, name and class, and each GPU's latest utilisation from the series.

A tenant sees only its own jobs everywhere (``/v1/nodes``' rules for the map); the admin all.
The ``/v1/dashboard`` routes are part of the typed API contract: their answers are documented
as ``schemas.Whoami``, ``QueuePage``, ``FairShareTables`` and ``GpuMap`` (built here as plain
JSON for speed; ``tests/integration/test_api_contract.py`` checks they round-trip), and their
errors are RFC 7807 problems (``problems.py``). The page and its assets are not API: they stay
out of the OpenAPI document.
"""

# no ``from __future__ import annotations``: FastAPI reads the route signatures' types at runtime
import dataclasses
import hashlib
import json
import logging
import math
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from pydantic import AfterValidator, BaseModel

from gpufence import __version__
from gpufence.control.base.config import ADMIN
from gpufence.control.base.jobspec import NO_CONTROL_PATTERN, from_stored
from gpufence.control.base.tenantview import redact
from gpufence.control.http import schemas
from gpufence.control.http.accounting_routes import query_text
from gpufence.control.http.auth import tenant_dependency
from gpufence.control.http.problems import error_responses
from gpufence.control.observe import dashboard_views
from gpufence.control.observe.series_view import SeriesQueryError
from gpufence.control.plane import CALL_TIMEOUT_S, AccessError, ControlPlane, InvalidField
from gpufence.control.store import database as st

log = logging.getLogger("gpufence.dashboard")

ASSETS = "dashboard"
"""Package directory (next to this module) holding the page, its scripts and styles."""
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# scripts and styles from this server only; no inline script, no framing, no form posts
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
MAX_PAGE = 500
CLASSES = ("training", "serving", "interactive", "batch")
Clean = AfterValidator(query_text)  # filters go to SQLite: valid UTF-8, no control characters
NO_CONTROL = {"pattern": NO_CONTROL_PATTERN}  # query_text's rule, for the OpenAPI document
Filter = Annotated[str | None, Query(max_length=128, json_schema_extra=NO_CONTROL), Clean]
ERRORS = (401, 503)  # a bad token; the store or the reconciler not answering


def documented(model: type[BaseModel], *errors: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` of a route that builds its JSON itself: 200 is ``model``."""
    return {200: {"model": model, "description": "OK"}} | error_responses(*errors)


class Asset:
    def __init__(self, body: bytes, content_type: str) -> None:
        self.body = body
        self.content_type = content_type
        self.etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'


def load_assets() -> dict[str, Asset]:
    """Every file of the dashboard directory by name (read once: a name not in it is a 404, so
    no path from a request ever reaches the file system)."""
    out: dict[str, Asset] = {}
    root = resources.files("gpufence.control.http").joinpath(ASSETS)
    if not root.is_dir():  # a broken install: the API still serves, `/` says what is missing
        log.error("the dashboard's files are missing from this install (%s)", root)
        return out
    for entry in root.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
        if entry.is_file() and suffix in CONTENT_TYPES:
            out[entry.name] = Asset(entry.read_bytes(), CONTENT_TYPES[suffix])
    return out


def _asset_response(request: Request, asset: Asset) -> Response:
    headers = {**SECURITY_HEADERS, "ETag": asset.etag, "Cache-Control": "no-cache"}
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.content_type, headers=headers)


def _gpus(spec: dict[str, Any]) -> str:
    try:
        req = from_stored(spec)
    except ValueError:
        return "?"
    what = req.request().describe()
    return f"{req.replicas}x {what}" if req.replicas != 1 else what


def job_summary(row: st.JobRow) -> dict[str, Any]:
    """A job as the dashboard's lists show it (no spec: the job page fetches the whole job)."""
    return {
        "id": row.id,
        "seq": row.seq,
        "name": row.spec.get("name"),
        "tenant": row.tenant,
        "state": row.state,
        "class": row.workload_class,
        "partition": row.partition,
        "queue": row.queue,
        "gpus": _gpus(row.spec),
        "attempt": row.attempt,
        "reason": row.reason,
        "message": row.message,
        "submitted_at": row.submitted_at,
        "started_at": row.started_at,
        "ended_at": row.ended_at,
    }


def fast_json(body: dict[str, Any]) -> Response:
    """``body`` (plain JSON types only) serialised in one ``json.dumps``: FastAPI's encoder
    walks every value first, which for a 1,000-GPU map costs more than the map itself."""
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")


def _latest(values: list[float | None]) -> float | None:
    for v in reversed(values):
        if v is not None and math.isfinite(v):
            return v
    return None


def gpu_utilisation(plane: ControlPlane, tenant: str) -> dict[str, dict[str, float | None]]:
    """``"node/index"`` -> the latest sampled utilisation and memory of that GPU (none on a
    plane that samples no GPU counters)."""
    step = plane.config.telemetry.series_step_s
    now = plane.now()
    try:
        series = plane.series(tenant, now - 4 * step, now, step)
    except (SeriesQueryError, TimeoutError):
        return {}
    return {
        f"{g.node}/{g.gpu}": {
            "utilization": _latest(g.utilization),
            "memory_used_bytes": _latest(g.memory_used_bytes),
        }
        for g in series.gpus
    }


def _queue_page(
    plane: ControlPlane,
    tenant: str,
    state: list[str] | None,
    filters: dict[str, str | None],
    offset: int,
    limit: int,
) -> Response:
    """``queue``'s answer (``filters``: partition, queue, tenant, workload_class as asked)."""
    states = tuple(state or (st.PENDING,))
    bad = [s for s in states if s not in st.STATES]
    if bad:
        valid = ", ".join(st.STATES)
        raise InvalidField(("query", "state"), f"unknown state {bad[0]!r} (valid: {valid})")
    workload_class, tenant_filter = filters["workload_class"], filters["tenant"]
    if workload_class is not None and workload_class not in CLASSES:
        raise InvalidField(
            ("query", "class"),
            f"unknown class {workload_class!r} (valid: {', '.join(CLASSES)})",
        )
    if tenant != ADMIN:
        if tenant_filter not in (None, "", tenant):
            raise AccessError("a tenant lists only its own jobs")
        tenant_filter = tenant
    asked = {**filters, "tenant": tenant_filter}
    with plane.store.reader() as r:
        total, rows = r.page(
            states=states, filters={k: v for k, v in asked.items() if v}, limit=limit, offset=offset
        )
    owner = plane.owner()
    shown = [
        row
        if tenant == ADMIN or not row.message
        else dataclasses.replace(row, message=redact(row.message, tenant, owner))
        for row in rows
    ]
    pending = [row.id for row in shown if row.state == st.PENDING]
    why = plane.pending_reasons(pending, tenant) if pending else {}
    jobs = []
    for row in shown:
        j = job_summary(row)
        if row.id in why:
            j["pending"] = why[row.id]
        jobs.append(j)
    return fast_json({"total": total, "offset": offset, "limit": limit, "jobs": jobs})


def _page_router() -> APIRouter:
    """``/`` and ``/ui/{name}``: the page and its files (no data, no token)."""
    router = APIRouter()
    assets = load_assets()

    # async: bytes already in memory, served on the event loop without a thread-pool hop
    @router.get("/", include_in_schema=False)
    async def index(request: Request) -> Response:
        page = assets.get("index.html")
        if page is None:
            raise HTTPException(
                503,
                detail="the dashboard's files are missing from this install; reinstall gpufence",
            )
        return _asset_response(request, page)

    @router.get("/ui/{name}", include_in_schema=False)
    async def asset(name: str, request: Request) -> Response:
        found = assets.get(name)
        if found is None:
            raise HTTPException(404, detail=f"no dashboard file {name!r}")
        return _asset_response(request, found)

    return router


def dashboard_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter()
    router.include_router(_page_router())
    Tenant = Annotated[str, Depends(tenant_dependency(plane.config))]

    @router.get(
        "/v1/dashboard/whoami",
        tags=["dashboard"],
        responses=documented(schemas.Whoami, *ERRORS),
        response_model=None,
    )
    def whoami(tenant: Tenant) -> dict[str, Any]:
        """Who this token is: the dashboard's sign-in check. The admin also gets the tenant
        names (the queue page's filter)."""
        out: dict[str, Any] = {"tenant": tenant, "admin": tenant == ADMIN, "version": __version__}
        if tenant == ADMIN:
            out["tenants"] = [ADMIN, *plane.config.current_tenants()]
        out["partitions"] = list(plane.cluster.partitions)
        out["queues"] = sorted({q.name for q in plane.cluster.queues.values()})
        return out

    @router.get(
        "/v1/dashboard/queue",
        tags=["dashboard"],
        responses=documented(schemas.QueuePage, 401, 403, 422, 503),
        response_model=None,
    )
    def queue(
        tenant: Tenant,
        state: Annotated[
            list[str] | None,
            Query(
                description=f"repeatable, one of {', '.join(st.STATES)} (default: pending)",
                # as the check below (its 422 names the state), for the OpenAPI document
                json_schema_extra={"items": {"type": "string", "enum": list(st.STATES)}},
            ),
        ] = None,
        partition: Filter = None,
        queue_name: Annotated[
            str | None, Query(alias="queue", max_length=128, json_schema_extra=NO_CONTROL), Clean
        ] = None,
        tenant_filter: Annotated[
            str | None,
            Query(
                alias="tenant",
                max_length=128,
                description="admin only",
                json_schema_extra=NO_CONTROL,
            ),
            Clean,
        ] = None,
        workload_class: Annotated[
            str | None,
            Query(
                alias="class",
                max_length=128,
                description=f"one of {', '.join(CLASSES)}",
                json_schema_extra={"enum": [*CLASSES, None]},
            ),
            Clean,
        ] = None,
        offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    ) -> Response:
        """One page of jobs (submission order) and how many match; a tenant's own only."""
        filters = {
            "partition": partition,
            "queue": queue_name,
            "tenant": tenant_filter,
            "workload_class": workload_class,
        }
        return _queue_page(plane, tenant, state, filters, offset, limit)

    router.include_router(_map_router(plane))
    return router


def _map_router(plane: ControlPlane) -> APIRouter:
    """``/v1/dashboard/fairshare`` and ``/v1/dashboard/gpus`` (apart from ``dashboard_router``
    only to keep each function short)."""
    router = APIRouter()
    Tenant = Annotated[str, Depends(tenant_dependency(plane.config))]

    @router.get(
        "/v1/dashboard/fairshare",
        tags=["dashboard"],
        responses=documented(schemas.FairShareTables, *ERRORS),
        response_model=None,
    )
    def fairshare(_tenant: Tenant) -> dict[str, Any]:
        """Every partition's fair-share table: queue, tenant, weight, GPUs held, decayed usage,
        share and rank (1 = served next), as ``explain`` shows a job's partition."""
        tables = plane.reconciler.call(dashboard_views.fair_share_tables).result(CALL_TIMEOUT_S)
        return {"partitions": tables}

    @router.get(
        "/v1/dashboard/gpus",
        tags=["dashboard"],
        responses=documented(schemas.GpuMap, *ERRORS),
        response_model=None,
    )
    def gpus(tenant: Tenant) -> Response:
        """The GPU map: ``/v1/nodes`` (a tenant: its own job ids, counts of the others'),
        ``jobs`` (id -> tenant, name, class, partition, state of each job shown) and ``util``
        (``"node/index"`` -> latest utilisation 0..1 and memory used)."""
        nodes = plane.nodes(tenant)
        active = plane.jobs(tenant, states=st.ACTIVE, limit=10_000)  # a tenant: its own
        info = {
            row.id: {
                "tenant": row.tenant,
                "name": row.spec.get("name"),
                "class": row.workload_class,
                "partition": row.partition,
                "state": row.state,
            }
            for row in active
        }
        out: dict[str, Any] = {
            "nodes": nodes,
            "jobs": info,
            "util": gpu_utilisation(plane, tenant),
        }
        if tenant != ADMIN:
            out["other_tenants_gpus"] = sum(int(n.get("other_tenants_gpus", 0)) for n in nodes)
        return fast_json(out)

    return router
