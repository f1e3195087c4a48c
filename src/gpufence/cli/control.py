"""``gpufence submit``, and ``register(app)``, which adds every control-plane verb to the app.

The verbs live by group: ``up.py`` (the server), ``job_verbs.py`` (queue, status, explain,
cancel), ``logs_verb.py``, ``cluster_verbs.py`` (nodes, partitions, events, top, advise),
``context_verbs.py`` (the client config). How a client verb finds its server and token, and its
exit codes, are in ``connect.py``; ``-o`` / ``--watch`` / ``--limit`` in ``output.py``.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from gpufence.cli import accounting_verbs, cluster_verbs, job_verbs
from gpufence.cli.connect import (
    ContextOpt,
    DataOpt,
    TokenOpt,
    UrlOpt,
    client_errors,
    client_for,
)
from gpufence.cli.context_verbs import context_app
from gpufence.cli.logs_verb import logs
from gpufence.cli.render import err_console
from gpufence.cli.units import parse_duration, parse_size
from gpufence.cli.up import up

# ------------------------------------------------------------------------------------ submit


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{p!r} is not KEY=VALUE", param_hint="--env")
        env[key] = value
    return env


def submit(
    command: Annotated[
        list[str],
        typer.Argument(
            metavar="CMD",
            help="the command to run, after --: -- python train.py --lr 3e-4",
            show_default=False,
        ),
    ],
    gpus: Annotated[
        int | None, typer.Option("--gpus", metavar="N", help="whole GPUs per replica")
    ] = None,
    mig: Annotated[
        str | None,
        typer.Option("--mig", metavar="PROFILE", help="one MIG instance per replica, e.g. 1g.10gb"),
    ] = None,
    gpu_fraction: Annotated[
        float | None,
        typer.Option("--gpu-fraction", metavar="F", help="a share of one GPU, 0 < F < 1"),
    ] = None,
    gpu_mem: Annotated[
        float | None,
        typer.Option("--gpu-mem", metavar="GIB", help="GiB of GPU memory with --gpu-fraction"),
    ] = None,
    replicas: Annotated[
        int | None,
        typer.Option("--replicas", metavar="R", help="gang size: R members placed together"),
    ] = None,
    partition: Annotated[
        str | None,
        typer.Option(
            "--partition",
            metavar="NAME",
            help="partition (fence) to run in [default: one that admits its class]",
        ),
    ] = None,
    queue: Annotated[
        str | None,
        typer.Option(
            "--queue", metavar="NAME", help="queue to wait in [default: the tenant's queue]"
        ),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(
            "--priority", metavar="P", help="higher runs first within its queue [default: 0]"
        ),
    ] = None,
    checkpointable: Annotated[
        bool,
        typer.Option(
            "--checkpointable",
            help="it checkpoints on notice (may be preempted, lent capacity, requeued)",
        ),
    ] = False,
    est_runtime: Annotated[
        float | None,
        typer.Option(
            "--est-runtime", metavar="SECONDS", help="estimated runtime (s), for backfill"
        ),
    ] = None,
    cpus: Annotated[
        float | None,
        typer.Option(
            "--cpus",
            metavar="N",
            help="CPU cores per replica (placed, and the job is held to them)",
        ),
    ] = None,
    mem: Annotated[
        str | None,
        typer.Option(
            "--mem",
            metavar="SIZE",
            help="host memory per replica, e.g. 8G (over it the job is OOM-killed)",
        ),
    ] = None,
    time_limit: Annotated[
        str | None,
        typer.Option(
            "--time-limit",
            metavar="DURATION",
            help="stop each attempt after this long, e.g. 90 (s), 30m, 2h, 1d, 01:30:00",
        ),
    ] = None,
    slo_p99_ms: Annotated[
        float | None,
        typer.Option(
            "--slo-p99-ms", metavar="MS", help="serving: the p99 latency (ms) it serves users at"
        ),
    ] = None,
    metrics_url: Annotated[
        str | None,
        typer.Option(
            "--metrics-url",
            metavar="URL",
            help="serving: the replica's Prometheus endpoint; gpufence reads its latency "
            "histogram (*_request_duration_seconds) from it",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            metavar="PORT",
            help="serving: as --metrics-url, http://<its node>:PORT/metrics",
        ),
    ] = None,
    latency_metric: Annotated[
        str | None,
        typer.Option(
            "--latency-metric",
            metavar="NAME",
            help="serving: the histogram to read [default: any *_request_duration_seconds]",
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", metavar="KEY=VALUE", help="an environment variable (repeatable)"),
    ] = None,
    workload_class: Annotated[
        str | None,
        typer.Option(
            "--class",
            metavar="CLASS",
            help="training (default), serving, interactive or batch",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", metavar="NAME", help="a name shown beside its id")
    ] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option(
            "--max-attempts",
            metavar="N",
            help="runs at most N times (requeues after a lost node or restart) [default: 3]",
        ),
    ] = None,
    cwd: Annotated[
        str | None,
        typer.Option("--cwd", metavar="DIR", help="working directory [default: the current one]"),
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option("--tenant", metavar="NAME", help="admin only: submit on behalf of a tenant"),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Submit a job; prints its id (a job that can never run is rejected: exit 1)."""
    body: dict[str, Any] = {"command": command, "cwd": cwd or os.getcwd()}
    try:
        mem_bytes = parse_size(mem) if mem is not None else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--mem") from None
    try:
        time_limit_s = parse_duration(time_limit) if time_limit is not None else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--time-limit") from None
    optional: dict[str, Any] = {
        "gpus": gpus,
        "mig": mig,
        "gpu_fraction": gpu_fraction,
        "gpu_mem_gib": gpu_mem,
        "replicas": replicas,
        "partition": partition,
        "queue": queue,
        "priority": priority,
        "est_runtime_s": est_runtime,
        "cpus": cpus,
        "mem_bytes": mem_bytes,
        "time_limit_s": time_limit_s,
        "slo_p99_ms": slo_p99_ms,
        "metrics_url": metrics_url,
        "metrics_port": metrics_port,
        "latency_metric": latency_metric,
        "class": workload_class,
        "name": name,
        "max_attempts": max_attempts,
        "tenant": tenant,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if mig is not None or gpu_fraction is not None:
        body.setdefault("gpus", 1)
    if checkpointable:
        body["checkpointable"] = True
    if env:
        body["env"] = _parse_env(env)
    client = client_for(url, token, data, context)
    with client_errors():
        res = client.submit(body)
    typer.echo(res["id"])
    if res.get("state") == "pending" and res.get("reason"):
        err_console().print(f"pending ({res['reason']}): {res.get('message', '')}", markup=False)


def register(app: typer.Typer) -> None:
    """Add the control-plane verbs to the ``gpufence`` app."""
    app.command()(up)
    app.command(context_settings={"allow_interspersed_args": False})(submit)
    app.command()(job_verbs.queue)
    app.command()(job_verbs.status)
    app.command()(job_verbs.explain)
    app.command()(job_verbs.cancel)
    app.command()(logs)
    app.command()(cluster_verbs.nodes)
    app.command()(cluster_verbs.partitions)
    app.command()(cluster_verbs.events)
    app.command()(cluster_verbs.top)
    app.command()(cluster_verbs.advise)
    app.command()(accounting_verbs.history)
    app.command()(accounting_verbs.usage)
    app.add_typer(context_app, name="context")
