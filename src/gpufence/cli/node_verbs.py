"""``gpufence node drain|undrain|list`` and ``gpufence reserve [list|delete]``: drained nodes
and maintenance windows (the admin's; a tenant's token gets 403). ``-o json`` documents:

* ``node list``: ``{"nodes": [{"name", "up", "drain": {"reason", "deadline"}|null}],
  "drains": [DRAIN, ...]}``;
* ``reserve list``: ``GET /v1/maintenance``: ``{"now", "drains": [DRAIN], "maintenance":
  [WINDOW]}``, WINDOW ``{"id", "nodes", "start", "end", "duration_s", "reason", "state", "by"}``;

times are the server's clock as Unix times (the table shows them in UTC).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer

from gpufence.cli.connect import (
    ContextOpt,
    DataOpt,
    TokenOpt,
    UrlOpt,
    client_errors,
    client_for,
    fail,
)
from gpufence.cli.output import Frame, OutputOpt, check_format, show
from gpufence.cli.render import Col, build_table, err_console, out_console
from gpufence.cli.units import format_duration, parse_duration
from gpufence.control.http.client import Client

node_app = typer.Typer(help="Drain, undrain and list nodes (admin).", no_args_is_help=True)
reserve_app = typer.Typer(
    help="Maintenance reservations (admin): `gpufence reserve --nodes n1,n2 --start TIME "
    "--duration DUR --reason TEXT`; `reserve list`; `reserve delete ID`.",
    invoke_without_command=True,
)

NodeArg = Annotated[str, typer.Argument(metavar="NODE", help="node name", show_default=False)]
ReasonOpt = Annotated[
    str, typer.Option("--reason", metavar="TEXT", help="why (shown in pending reasons)")
]


def _client(url: str | None, token: str | None, data: Path | None, context: str | None) -> Client:
    return client_for(url, token, data, context)


def _q(part: str) -> str:
    return quote(part, safe="")


def _seconds(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise fail(f"{flag}: {exc}") from None


def _utc(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@node_app.command("drain")
def drain(
    node: NodeArg,
    reason: ReasonOpt,
    deadline: Annotated[
        str | None,
        typer.Option(
            "--deadline",
            metavar="DUR",
            help="stop running work by then (e.g. 30m): it is noticed now, as for a "
            "preemption, and requeued; without it running work finishes",
        ),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """No new work on NODE; running work finishes (or is stopped by --deadline)."""
    body: dict[str, Any] = {"reason": reason, "deadline_s": _seconds(deadline, "--deadline")}
    with client_errors():
        got = _client(url, token, data, context)._json(
            "POST", f"/v1/nodes/{_q(node)}/drain", body=body
        )
    until = f"; running work stopped by {_utc(got['deadline'])}" if got["deadline"] else ""
    typer.echo(f"node {got['node']} drained: {got['reason']}{until}")


@node_app.command("undrain")
def undrain(
    node: NodeArg,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """NODE takes work again."""
    with client_errors():
        _client(url, token, data, context)._json("POST", f"/v1/nodes/{_q(node)}/undrain")
    typer.echo(f"node {node} undrained")


@node_app.command("list")
def list_nodes(
    output: OutputOpt = "table",
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Every node: up or down, drained (and why), GPUs in use."""
    fmt = check_format(output)
    client = _client(url, token, data, context)
    with client_errors():
        ns = client.nodes()
    docs = [{"name": n["name"], "up": n["up"], "drain": n.get("drain")} for n in ns]
    rows = []
    for n, d in zip(ns, docs, strict=True):
        used = sum(1 for g in n["gpus"] if g.get("state") not in ("free", "down"))
        dr = d["drain"]
        state = ("up" if d["up"] else "down") + (", drained" if dr else "")
        why = dr["reason"] if dr else ""
        if dr and dr.get("deadline"):
            why += f" (stop by {_utc(dr['deadline'])})"
        rows.append([n["name"], state, f"{used}/{len(n['gpus'])}", why or "-"])
    cols = (Col("node", max_width=24), Col("state"), Col("gpus used"), Col("drain", flex=True))
    show(Frame({"nodes": docs}, lambda wide: build_table(cols, rows, wide)), fmt)


_ISO = re.compile(r"\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2})?)?(Z|[+-]\d{2}:?\d{2})?")


def parse_start(text: str) -> dict[str, float]:
    """``now``, ``+DUR`` / ``in DUR`` (from now), or an ISO 8601 time (UTC unless it says)."""
    t = text.strip()
    if t.lower() == "now":
        return {"start_in_s": 0.0}
    rel = t[1:] if t.startswith("+") else t[3:] if t.lower().startswith("in ") else None
    if rel is not None:
        secs = _seconds(rel.strip(), "--start")
        assert secs is not None
        return {"start_in_s": secs}
    if not _ISO.fullmatch(t):
        raise fail(
            f"--start: {text!r} is not a time; write now, +2h (from now) or an ISO 8601 time "
            "such as 2026-12-06T02:00 (UTC) or 2026-12-06T02:00+01:00"
        )
    when = datetime.fromisoformat(t.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return {"start": when.timestamp()}


@reserve_app.callback()
def reserve(
    ctx: typer.Context,
    nodes: Annotated[str | None, typer.Option("--nodes", metavar="NODES", help="n1,n2,...")] = None,
    start: Annotated[
        str | None,
        typer.Option("--start", metavar="TIME", help="now, +2h, or ISO 8601 (UTC unless it says)"),
    ] = None,
    duration: Annotated[
        str | None, typer.Option("--duration", metavar="DUR", help="e.g. 2h")
    ] = None,
    reason: Annotated[str | None, typer.Option("--reason", metavar="TEXT", help="why")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """A maintenance window: jobs whose time limit would reach into it (and jobs without one)
    do not start on its nodes; during it they take no work."""
    if ctx.invoked_subcommand is not None:
        return
    missing = [
        flag
        for flag, v in (("--nodes", nodes), ("--start", start), ("--duration", duration))
        if not v
    ]
    if missing or reason is None:
        raise fail(f"give {', '.join([*missing, *([] if reason else ['--reason'])])}")
    assert nodes is not None and start is not None
    body: dict[str, Any] = {
        "nodes": [n.strip() for n in nodes.split(",") if n.strip()],
        "duration_s": _seconds(duration, "--duration"),
        "reason": reason,
        **parse_start(start),
    }
    with client_errors():
        got = _client(url, token, data, context)._json("POST", "/v1/maintenance", body=body)
    typer.echo(
        f"maintenance {got['id']} on {','.join(got['nodes'])} from {_utc(got['start'])} for "
        f"{format_duration(got['duration_s'])}: {got['reason']}"
    )
    for j in got.get("running_into", []):
        err_console().print(
            f"warning: {j} runs on its nodes and may still run when it begins (it is left "
            "running: gpufence node drain NODE --deadline DUR stops it)",
            markup=False,
        )


@reserve_app.command("list")
def list_windows(
    output: OutputOpt = "table",
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Maintenance windows (scheduled, active, over) and drained nodes."""
    fmt = check_format(output)
    with client_errors():
        doc = _client(url, token, data, context)._json("GET", "/v1/maintenance")
    rows = [
        [
            w["id"],
            ",".join(w["nodes"]),
            _utc(w["start"]),
            format_duration(w["duration_s"]),
            w["state"],
            w["reason"],
        ]
        for w in doc["maintenance"]
    ]
    cols = (
        Col("id"),
        Col("nodes", max_width=32),
        Col("start"),
        Col("duration"),
        Col("state"),
        Col("reason", flex=True),
    )
    empty = None if rows else "no maintenance windows"
    show(Frame(doc, lambda wide: build_table(cols, rows, wide), empty=empty), fmt)
    for d in doc["drains"] if fmt not in ("json", "yaml") else ():
        out_console().print(f"node {d['node']} drained: {d['reason']}", markup=False)


@reserve_app.command("delete")
def delete_window(
    window_id: Annotated[str, typer.Argument(metavar="ID", help="e.g. m1")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Call a maintenance window off: its nodes take work again at once."""
    with client_errors():
        _client(url, token, data, context)._json("DELETE", f"/v1/maintenance/{_q(window_id)}")
    typer.echo(f"maintenance {window_id} deleted")
