"""Control-plane verbs of the ``gpufence`` CLI: up, submit, queue, status, explain, cancel, logs,
nodes, top, advise. ``register(app)`` adds them to the main typer app.

``up`` lives in ``cli/up.py``, the tables and the top view in ``cli/render.py``.

Every verb but ``up`` talks HTTP through ``gpufence.control.http.client`` and takes ``--url`` and
``--token`` (else ``$GPUFENCE_URL`` / ``$GPUFENCE_TOKEN``, else what ``gpufence up`` wrote to
``$GPUFENCE_DATA`` or ``~/.gpufence``). Exit codes: 0 ok; 1 the server refused or is not there
(rejected job, 401/403, no server); 2 bad input (a bad flag, an invalid field, an unknown job).
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from gpufence.advice.present import json_text
from gpufence.cli.render import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    attempts_table,
    err_console,
    fair_share_table,
    job_reason,
    nodes_table,
    out_console,
    queue_table,
    styled,
    top_frame,
    when,
)
from gpufence.cli.units import format_duration, format_size, parse_duration, parse_size
from gpufence.cli.up import up
from gpufence.control.http.client import Client, ClientError, Rejected

UrlOpt = Annotated[
    str | None,
    typer.Option("--url", help="control plane URL (default: $GPUFENCE_URL, DATA/server.json)"),
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        help="API token (default: $GPUFENCE_TOKEN, DATA/admin.token)",
        show_default=False,
    ),
]


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Client errors end the command with the server's message, never a traceback."""
    try:
        yield
    except Rejected as e:
        err_console().print(f"rejected ({e.reason}): {e}", markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except ClientError as e:
        err_console().print(f"error: {e}", markup=False, soft_wrap=True)
        raise typer.Exit(2 if e.bad_input else 1) from None


def _client(url: str | None, token: str | None) -> Client:
    return Client(url=url, token=token)


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
        typer.Argument(metavar="CMD", help="the command to run, e.g. -- python train.py --lr 3e-4"),
    ],
    gpus: Annotated[int | None, typer.Option("--gpus", help="whole GPUs per replica")] = None,
    mig: Annotated[str | None, typer.Option("--mig", help="one MIG instance, e.g. 1g.10gb")] = None,
    gpu_fraction: Annotated[
        float | None, typer.Option("--gpu-fraction", help="a share of one GPU, 0 < F < 1")
    ] = None,
    gpu_mem: Annotated[
        float | None, typer.Option("--gpu-mem", help="GiB of GPU memory with --gpu-fraction")
    ] = None,
    replicas: Annotated[int | None, typer.Option("--replicas", help="gang size")] = None,
    partition: Annotated[str | None, typer.Option("--partition")] = None,
    queue: Annotated[str | None, typer.Option("--queue")] = None,
    priority: Annotated[int | None, typer.Option("--priority")] = None,
    checkpointable: Annotated[
        bool, typer.Option("--checkpointable", help="may be preempted (it checkpoints)")
    ] = False,
    est_runtime: Annotated[
        float | None, typer.Option("--est-runtime", help="estimated runtime (s), for backfill")
    ] = None,
    cpus: Annotated[
        float | None,
        typer.Option("--cpus", help="CPU cores per replica (placed, and the job is held to them)"),
    ] = None,
    mem: Annotated[
        str | None,
        typer.Option(
            "--mem", help="host memory per replica, e.g. 8G (over it the job is OOM-killed)"
        ),
    ] = None,
    time_limit: Annotated[
        str | None,
        typer.Option(
            "--time-limit",
            help="stop each attempt after this long, e.g. 90 (s), 30m, 2h, 1d, 01:30:00",
        ),
    ] = None,
    slo_p99_ms: Annotated[
        float | None,
        typer.Option("--slo-p99-ms", help="serving: the p99 latency (ms) it serves users at"),
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="KEY=VALUE, repeatable")] = None,
    workload_class: Annotated[
        str | None,
        typer.Option("--class", help="training (default), serving, interactive or batch"),
    ] = None,
    name: Annotated[str | None, typer.Option("--name")] = None,
    max_attempts: Annotated[int | None, typer.Option("--max-attempts")] = None,
    cwd: Annotated[
        str | None,
        typer.Option("--cwd", help="working directory [default: the current one]"),
    ] = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="admin only: submit on behalf of a tenant")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
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
    with _errors():
        res = _client(url, token).submit(body)
    typer.echo(res["id"])
    if res.get("state") == "pending" and res.get("reason"):
        err_console().print(f"pending ({res['reason']}): {res.get('message', '')}", markup=False)


# ------------------------------------------------------------------------------------- queue


def queue(
    all_jobs: Annotated[bool, typer.Option("--all", "-a", help="include ended jobs")] = False,
    state: Annotated[
        list[str] | None, typer.Option("--state", help="only this state (repeatable)")
    ] = None,
    partition: Annotated[str | None, typer.Option("--partition")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="admin: one tenant")] = None,
    limit: Annotated[int, typer.Option("--limit")] = 1000,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Jobs waiting and running (with why each pending job waits)."""
    states = state or ([] if all_jobs else list(ACTIVE_STATES))
    with _errors():
        jobs = _client(url, token).jobs(states, partition, tenant, limit)
    if not jobs:
        err_console().print("no jobs" + ("" if all_jobs or state else " waiting or running"))
        return
    out_console().print(queue_table(jobs))


# ------------------------------------------------------------------------------------ status


def status(
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """A job: its state, attempts (where, which devices), exit code."""
    with _errors():
        j = _client(url, token).job(job_id)
    out = out_console()
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    spec = j.get("spec", {})
    rows: list[tuple[str, RenderableType]] = [
        ("job", j["id"] + (f" ({j['name']})" if j.get("name") else "")),
        ("state", styled(j["state"])),
        ("tenant", j.get("tenant", "")),
        ("class", j.get("class", "")),
        ("partition / queue", f"{j.get('partition') or '-'} / {j.get('queue') or '-'}"),
        ("request", j.get("gpus", "")),
        ("limits", _limits(spec)),
        ("command", " ".join(spec.get("command", []))),
        ("submitted", when(j.get("submitted_at"))),
        ("started", when(j.get("started_at"))),
        ("ended", when(j.get("ended_at"))),
        ("exit code", "-" if j.get("exit_code") is None else str(j["exit_code"])),
        ("attempt", str(j.get("attempt", 1))),
    ]
    why = job_reason(j)
    if why:
        rows.append(("reason", why))
    for k, v in rows:
        head.add_row(k, v if not isinstance(v, str) else Text(v))
    out.print(head)
    attempts = j.get("attempts", [])
    if attempts:
        out.print(attempts_table(attempts))


def _limits(spec: dict[str, Any]) -> str:
    """'2 CPUs, 8G memory, time limit 2h' per replica, from the stored request."""
    parts = []
    if spec.get("cpus") is not None:
        parts.append(f"{spec['cpus']:g} CPU{'s' if spec['cpus'] != 1 else ''}")
    if spec.get("mem_bytes") is not None:
        parts.append(f"{format_size(int(spec['mem_bytes']))} memory")
    if spec.get("time_limit_s") is not None:
        parts.append(f"time limit {format_duration(spec['time_limit_s'])}")
    return ", ".join(parts) or "-"


# ----------------------------------------------------------------------------------- explain


def explain(
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Why a job waits, and its partition's fair-share order."""
    with _errors():
        e = _client(url, token).explain(job_id)
    out = out_console()
    out.print(
        Text.assemble(
            (e["id"], "bold"),
            " ",
            styled(e["state"]),
            f"  partition {e.get('partition') or '-'}, queue {e.get('queue') or '-'}, "
            f"attempt {e.get('attempt')}",
        )
    )
    pending = e.get("pending")
    if pending:
        out.print(Text(f"pending: {pending['reason']}: {pending['message']}"), soft_wrap=True)
    elif e.get("reason") or e.get("message"):
        out.print(Text(f"{e.get('reason')}: {e.get('message')}".strip(": ")), soft_wrap=True)
    notice = e.get("notice")
    if notice:
        out.print(Text(f"notice: {notice['reason']} (deadline {when(notice['deadline'])})"))
    fair = e.get("fair_share") or []
    if fair:
        out.print(fair_share_table(fair, e.get("partition"), e.get("queue")))


# ------------------------------------------------------------------------------------ cancel


def cancel(
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Cancel a job (a running one is stopped: SIGTERM, grace period, SIGKILL)."""
    with _errors():
        res = _client(url, token).cancel(job_id)
    typer.echo(f"{res['id']}: {res['state']}")


# -------------------------------------------------------------------------------------- logs


def logs(
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="until the job ends")] = False,
    attempt: Annotated[int | None, typer.Option("--attempt", help="default: the latest")] = None,
    rank: Annotated[int, typer.Option("--rank", help="gang member")] = 0,
    err: Annotated[bool, typer.Option("--err", help="stderr instead of stdout")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print a job's output (-f: follow it, across requeues, until the job ends)."""
    stream = "err" if err else "out"
    with _errors():
        client = _client(url, token)
        first = client.logs(job_id, attempt, rank, stream, 0)
        current = int(first.headers.get("X-Log-Attempt") or attempt or 1)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        chunk = first
        while True:
            if chunk.body:
                typer.echo(decoder.decode(chunk.body), nl=False)
            offset = int(chunk.headers.get("X-Log-Offset") or 0)
            if not follow:
                if int(chunk.headers.get("X-Log-Size") or 0) <= offset:
                    break
                chunk = client.logs(job_id, current, rank, stream, offset)
                continue
            if not chunk.body:
                latest = int(chunk.headers.get("X-Job-Attempt") or current)
                if attempt is None and latest > current:
                    current, offset = latest, 0
                    typer.echo(decoder.decode(b"", final=True), nl=False)
                    err_console().print(f"--- attempt {current} ---")
                elif chunk.headers.get("X-Job-State") in TERMINAL_STATES:
                    break
                else:
                    time.sleep(0.5)
            chunk = client.logs(job_id, current, rank, stream, offset)
        typer.echo(decoder.decode(b"", final=True), nl=False)


# ------------------------------------------------------------------------------ nodes / top


def nodes(url: UrlOpt = None, token: TokenOpt = None) -> None:
    """The GPU map: every GPU with its partition, state, job(s) and MIG slots."""
    with _errors():
        ns = _client(url, token).nodes()
    out_console().print(nodes_table(ns))
    others = sum(int(n.get("other_tenants_gpus", 0)) for n in ns)
    if others:  # a tenant's view: other tenants' jobs are counted, not named
        out_console().print(f"{others} GPU{'s' if others != 1 else ''} held by other tenants")


def top(
    once: Annotated[bool, typer.Option("--once", help="print one frame and exit")] = False,
    interval: Annotated[float, typer.Option("--interval", help="seconds between frames")] = 1.0,
    head: Annotated[int, typer.Option("--head", help="jobs shown")] = 15,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Live view: partitions (fences), GPU map, queue head. Ctrl-C quits."""
    from rich.live import Live

    if interval <= 0:
        raise typer.BadParameter("must be > 0", param_hint="--interval")
    client = _client(url, token)
    with _errors():
        if once:
            out_console().print(top_frame(client, head))
            return
        console = out_console()
        try:
            with Live(
                top_frame(client, head), console=console, screen=False, auto_refresh=False
            ) as live:
                while True:
                    time.sleep(interval)
                    live.update(top_frame(client, head), refresh=True)
        except KeyboardInterrupt:
            pass


# ------------------------------------------------------------------------------------ advise


def advise(
    as_json: Annotated[bool, typer.Option("--json", help="print the advice as JSON")] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="exit 2 when there is any warning (for CI / cron)")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Capacity advice from the control plane's own history: chronic preemption (and how big
    the serving fence should be), batch work in the serving queue, idle notebooks, lending that
    loses work, fragmentation; plus the spec rules with the numbers the history gives. A tenant
    token gets the advice about its own jobs only."""
    with _errors():
        res = _client(url, token).advice()
    items = res.get("advice", [])
    if as_json:
        typer.echo(json.dumps(res, indent=2))
    elif not items:
        err_console().print(f"no advice ({res.get('scope', '')}): no rule fired")
    else:
        out = out_console()
        for a in items:
            error = strict and a.get("severity") == "warning"
            for line in json_text(a, res.get("spec"), as_error=error):
                out.print(Text(line), soft_wrap=True)
        n = sum(1 for a in items if a.get("severity") == "warning")
        counts = f"{n} warning{'s' if n != 1 else ''}"
        err_console().print(f"{len(items)} advice ({counts}) for the {res.get('scope')}")
    if strict and any(a.get("severity") == "warning" for a in items):
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    """Add the control-plane verbs to the ``gpufence`` app."""
    app.command()(up)
    app.command(context_settings={"allow_interspersed_args": False})(submit)
    app.command()(queue)
    app.command()(status)
    app.command()(explain)
    app.command()(cancel)
    app.command()(logs)
    app.command()(nodes)
    app.command()(top)
    app.command()(advise)
