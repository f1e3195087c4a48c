"""Control-plane verbs of the ``gpufence`` CLI: up, submit, queue, status, explain, cancel, logs,
nodes, top. ``register(app)`` adds them to the main typer app.

Every verb but ``up`` talks HTTP through ``gpufence.control.client`` and takes ``--url`` and
``--token`` (else ``$GPUFENCE_URL`` / ``$GPUFENCE_TOKEN``, else what ``gpufence up`` wrote to
``$GPUFENCE_DATA`` or ``~/.gpufence``). Exit codes: 0 ok; 1 the server refused or is not there
(rejected job, 401/403, no server); 2 bad input (a bad flag, an invalid field, an unknown job).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpufence.control.client import Client, ClientError, Rejected, default_data_dir

DEFAULT_PORT = 7878  # = server.DEFAULT_PORT (the server module imports fastapi: kept lazy)
ACTIVE_STATES = ("pending", "starting", "running", "stopping")
TERMINAL_STATES = ("done", "failed", "cancelled", "reclaimed", "rejected")
STATE_STYLE = {
    "pending": "yellow",
    "starting": "cyan",
    "running": "green",
    "stopping": "magenta",
    "done": "dim green",
    "failed": "red",
    "cancelled": "dim",
    "reclaimed": "magenta",
    "rejected": "red",
    "free": "dim",
    "used": "green",
    "down": "red",
}

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


def _out() -> Console:
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


def _err() -> Console:
    return Console(stderr=True, highlight=False)


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Client errors end the command with the server's message, never a traceback."""
    try:
        yield
    except Rejected as e:
        _err().print(f"rejected ({e.reason}): {e}", markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except ClientError as e:
        _err().print(f"error: {e}", markup=False, soft_wrap=True)
        raise typer.Exit(2 if e.bad_input else 1) from None


def _client(url: str | None, token: str | None) -> Client:
    return Client(url=url, token=token)


def _styled(state: str) -> Text:
    return Text(state, style=STATE_STYLE.get(state, ""))


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _reason(job: dict[str, Any]) -> str:
    pending = job.get("pending")
    if isinstance(pending, dict):
        return f"{pending.get('reason', '')}: {pending.get('message', '')}".strip(": ")
    if job.get("state") in ("pending", "failed", "rejected", "stopping", "reclaimed"):
        reason, msg = job.get("reason") or "", job.get("message") or ""
        return f"{reason}: {msg}".strip(": ")
    return ""


# ---------------------------------------------------------------------------------------- up


def up(
    config: Annotated[
        Path | None, typer.Option("--config", help="cluster spec YAML (with a control: section)")
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="data directory (store, logs, token) [default: $GPUFENCE_DATA or ~/.gpufence]",
            show_default=False,
        ),
    ] = None,
    fake_gpus: Annotated[
        int | None,
        typer.Option("--fake-gpus", help="run on N made-up GPUs (no NVIDIA GPU needed)"),
    ] = None,
    fake_gpu_type: Annotated[
        str, typer.Option("--fake-gpu-type", help="GPU type of the fake GPUs")
    ] = "H100-80GB",
    host: Annotated[str, typer.Option("--host", help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="port (0 = any free one)")] = DEFAULT_PORT,
    log_level: Annotated[str, typer.Option("--log-level")] = "info",
) -> None:
    """Start the control plane: API server, reconciler and local executor (Ctrl-C stops it;
    running jobs keep running and are adopted by the next `up` on the same --data)."""
    import logging

    from gpufence.control.server import StartupError, build_plane, serve
    from gpufence.spec import SpecError, format_spec_error

    if not 0 <= port <= 65535:
        raise typer.BadParameter("must be 0..65535", param_hint="--port")
    data_dir = (data or default_data_dir()).expanduser()
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        plane = build_plane(config, data_dir, fake_gpus, fake_gpu_type)
        serve(plane, host, port, log_level=log_level.lower())
    except SpecError as e:
        _err().print(format_spec_error(e), markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except (StartupError, ValueError, FileNotFoundError) as e:
        _err().print(f"error: {e}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None


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
        _err().print(f"pending ({res['reason']}): {res.get('message', '')}", markup=False)


# ------------------------------------------------------------------------------------- queue


def _queue_table(jobs: list[dict[str, Any]], title: str | None = None) -> Table:
    now = time.time()
    table = Table(title=title, expand=False)
    for col in ("id", "tenant", "class", "partition", "state", "GPUs", "age", "name", "reason"):
        table.add_column(col, overflow="fold")
    for j in jobs:
        start = j.get("started_at") if j.get("state") in ("running", "stopping") else None
        table.add_row(
            j["id"],
            j.get("tenant", ""),
            j.get("class", ""),
            j.get("partition") or "-",
            _styled(j.get("state", "")),
            j.get("gpus", ""),
            _age(now - (start or j.get("submitted_at") or now)),
            j.get("name") or "",
            _reason(j),
        )
    return table


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
        _err().print("no jobs" + ("" if all_jobs or state else " waiting or running"))
        return
    _out().print(_queue_table(jobs))


# ------------------------------------------------------------------------------------ status


def status(
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """A job: its state, attempts (where, which devices), exit code."""
    with _errors():
        j = _client(url, token).job(job_id)
    out = _out()
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    spec = j.get("spec", {})
    rows: list[tuple[str, RenderableType]] = [
        ("job", j["id"] + (f" ({j['name']})" if j.get("name") else "")),
        ("state", _styled(j["state"])),
        ("tenant", j.get("tenant", "")),
        ("class", j.get("class", "")),
        ("partition / queue", f"{j.get('partition') or '-'} / {j.get('queue') or '-'}"),
        ("request", j.get("gpus", "")),
        ("command", " ".join(spec.get("command", []))),
        ("submitted", _when(j.get("submitted_at"))),
        ("started", _when(j.get("started_at"))),
        ("ended", _when(j.get("ended_at"))),
        ("exit code", "-" if j.get("exit_code") is None else str(j["exit_code"])),
        ("attempt", str(j.get("attempt", 1))),
    ]
    why = _reason(j)
    if why:
        rows.append(("reason", why))
    for k, v in rows:
        head.add_row(k, v if not isinstance(v, str) else Text(v))
    out.print(head)
    attempts = j.get("attempts", [])
    if attempts:
        table = Table(title="attempts")
        for col in (
            "attempt",
            "state",
            "partition",
            "devices",
            "started",
            "ended",
            "exit codes",
            "stop",
        ):
            table.add_column(col, overflow="fold")
        for a in attempts:
            pool = a["pool"] + (f" (lent by {a['lent_from']})" if a.get("lent_from") else "")
            devices = " ".join(
                f"r{rank}:{','.join(devs) or 'cpu'}" for rank, devs in enumerate(a["devices"])
            )
            codes = a.get("exit_codes")
            stop = a.get("stop_reason") or ""
            if stop and a.get("requeue"):
                stop += " (requeue)"
            table.add_row(
                str(a["attempt"]),
                a["state"],
                pool,
                devices,
                _when(a.get("started_at")),
                _when(a.get("ended_at")),
                "-" if codes is None else " ".join(str(c) for c in codes),
                stop,
            )
        out.print(table)


# ----------------------------------------------------------------------------------- explain


def explain(
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Why a job waits, and its partition's fair-share order."""
    with _errors():
        e = _client(url, token).explain(job_id)
    out = _out()
    out.print(
        Text.assemble(
            (e["id"], "bold"),
            " ",
            _styled(e["state"]),
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
        out.print(Text(f"notice: {notice['reason']} (deadline {_when(notice['deadline'])})"))
    fair = e.get("fair_share") or []
    if fair:
        table = Table(title=f"fair share in {e.get('partition')}")
        for col in (
            "rank",
            "queue",
            "tenant",
            "weight",
            "holding GPUs",
            "usage GPU-h",
            "share",
            "why",
        ):
            table.add_column(col, overflow="fold")
        for t in fair:
            mark = " *" if t["queue"] == e.get("queue") else ""
            table.add_row(
                str(t["rank"]),
                t["queue"] + mark,
                t.get("tenant") or "-",
                f"{t['weight']:g}",
                f"{t['holding_gpus']:g}",
                f"{t['decayed_usage_gpu_h']:.2f}",
                f"{t['share']:.3f}",
                t.get("explanation", ""),
            )
        out.print(table)


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
                    _err().print(f"--- attempt {current} ---")
                elif chunk.headers.get("X-Job-State") in TERMINAL_STATES:
                    break
                else:
                    time.sleep(0.5)
            chunk = client.logs(job_id, current, rank, stream, offset)
        typer.echo(decoder.decode(b"", final=True), nl=False)


# ------------------------------------------------------------------------------ nodes / top


def _mig_slots(g: dict[str, Any]) -> str:
    slots = g.get("mig")
    if not slots:
        return ""
    return " ".join(f"{s['profile']}@{s['start']}:{s['job'] or '-'}" for s in slots)


def _nodes_table(nodes: list[dict[str, Any]]) -> Table:
    table = Table(title="GPUs")
    for col in ("node", "GPU", "type", "partition", "state", "jobs", "MIG slots"):
        table.add_column(col, overflow="fold")
    for n in nodes:
        node_name = n["name"] + (" (fake)" if n.get("fake") else "")
        if not n.get("up", True):
            node_name += " DOWN"
        for i, g in enumerate(n["gpus"]):
            used = g.get("milli_used", 0)
            state = g["state"]
            share = f" {used / 1000:.2f}" if 0 < used < 1000 and not g.get("mig") else ""
            table.add_row(
                node_name if i == 0 else "",
                str(g["index"]),
                g["type"],
                g["partition"] or "-",
                Text(state + share, style=STATE_STYLE.get(state, "")),
                " ".join(g.get("jobs", [])) or "-",
                _mig_slots(g),
            )
    return table


def nodes(url: UrlOpt = None, token: TokenOpt = None) -> None:
    """The GPU map: every GPU with its partition, state, job(s) and MIG slots."""
    with _errors():
        ns = _client(url, token).nodes()
    _out().print(_nodes_table(ns))


def _partitions_table(parts: list[dict[str, Any]]) -> Table:
    table = Table(title="partitions (fences)")
    for col in (
        "partition",
        "admits",
        "sharing",
        "GPUs",
        "used",
        "lent",
        "borrowed",
        "largest gang",
        "running",
        "pending",
    ):
        table.add_column(col)
    for p in parts:
        cap = p["capacity_gpus"]
        used = float(p["used_gpus"])
        pct = f" ({used / cap:.0%})" if cap else ""
        table.add_row(
            p["name"],
            ",".join(p["admits"]),
            p["sharing"],
            str(cap),
            f"{used:g}{pct}",
            str(p["lent_gpus"]),
            str(p["borrowed_gpus"]),
            str(p["largest_gang"]),
            str(p["running"]),
            str(p["pending"]),
        )
    return table


def _gpu_map(nodes: list[dict[str, Any]]) -> Table:
    """One line per node, one cell per GPU: the job on it, or '.' when free."""
    table = Table(title="GPU map", show_header=False, box=None, padding=(0, 1))
    table.add_column("node", style="bold")
    table.add_column("gpus")
    for n in nodes:
        cells = Text()
        for g in n["gpus"]:
            jobs = g.get("jobs", [])
            label = ",".join(jobs) if jobs else "."
            cells.append(f"[{g['index']}:{label}]", style=STATE_STYLE.get(g["state"], ""))
            cells.append(" ")
        table.add_row(n["name"], cells)
    return table


def _frame(client: Client, head: int) -> Group:
    parts = client.partitions()
    ns = client.nodes()
    jobs = client.jobs(ACTIVE_STATES, limit=max(head, 1) * 4)
    order = {"running": 0, "stopping": 1, "starting": 2, "pending": 3}
    jobs.sort(key=lambda j: (order.get(j["state"], 9), j.get("seq", 0)))
    shown = jobs[:head]
    title = f"queue head ({len(shown)} of {len(jobs)} active)"
    stamp = Text(f"gpufence top  {client.url}  {time.strftime('%H:%M:%S')}", style="bold")
    return Group(stamp, _partitions_table(parts), _gpu_map(ns), _queue_table(shown, title))


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
            _out().print(_frame(client, head))
            return
        console = _out()
        try:
            with Live(
                _frame(client, head), console=console, screen=False, auto_refresh=False
            ) as live:
                while True:
                    time.sleep(interval)
                    live.update(_frame(client, head), refresh=True)
        except KeyboardInterrupt:
            pass


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
