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

``make_app`` only assembles: one router per group of routes (submit: ``submission.py``; jobs,
cluster, ops: ``jobs_routes.py``, ``cluster_routes.py``, ``ops_routes.py``; hold / release:
``job_actions.py``; update: ``update_routes.py``; telemetry, dashboard, accounting), the
exception handlers (``handlers.py``), the body limit and the documents (``docs.py``).
"""

from gpufence import __version__
from gpufence.control.http.accounting_routes import accounting_router
from gpufence.control.http.accounts_routes import accounts_router
from gpufence.control.http.body_limit import LimitBody
from gpufence.control.http.cluster_routes import cluster_router
from gpufence.control.http.dashboard_routes import dashboard_router
from gpufence.control.http.docs import install_docs, install_openapi
from gpufence.control.http.handlers import install_handlers
from gpufence.control.http.job_actions import job_actions_router
from gpufence.control.http.jobs_routes import jobs_router
from gpufence.control.http.maintenance_routes import maintenance_router
from gpufence.control.http.ops_routes import ops_router
from gpufence.control.http.problems import SafeJSONResponse
from gpufence.control.http.pty_routes import pty_router
from gpufence.control.http.submission import FrontedAPI, SubmitFront, submit_router
from gpufence.control.http.submission import SubmitResponse as SubmitResponse  # its old home
from gpufence.control.http.telemetry_routes import telemetry_router
from gpufence.control.http.update_routes import update_router
from gpufence.control.plane import ControlPlane


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
    install_handlers(app)
    limit = plane.config.max_request_bytes
    app.add_middleware(LimitBody, limit=limit)
    # in the order they were always matched in (no two of them overlap, but the paths' order
    # in the OpenAPI document follows it)
    app.include_router(telemetry_router(plane))  # /v1/series, /v1/jobs/{id}/latency
    app.include_router(dashboard_router(plane))  # /, /ui/*, /v1/dashboard/*
    submit = submit_router(plane)  # POST /v1/jobs
    app.include_router(submit)
    app.include_router(job_actions_router(plane))  # hold, release, names
    app.include_router(update_router(plane))  # PATCH /v1/jobs/{ref}
    app.include_router(jobs_router(plane))  # the rest of /v1/jobs, /v1/events
    app.include_router(cluster_router(plane))  # /v1/nodes, /v1/partitions, /v1/advice
    app.include_router(ops_router(plane))  # /metrics, /healthz, /readyz
    app.include_router(accounting_router(plane))  # /v1/history, /v1/usage
    app.include_router(accounts_router(plane))  # /v1/admin/*: tenants, tokens, queues
    app.include_router(maintenance_router(plane))  # drains, /v1/maintenance
    app.include_router(pty_router(plane))  # /v1/jobs/{id}/pty (WebSocket)
    install_docs(app)
    install_openapi(app)
    # the submit route's hot path: its endpoint, ahead of FastAPI's machinery (submission.py)
    app.submit_front = SubmitFront.of(submit, app, limit)
    return app
