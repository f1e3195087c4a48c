"""Accounting verbs: ``history`` (sacct-like, one row per job) and ``usage`` (GPU-hours, jobs and
queue delay per tenant, partition or class over a period), from ``GET /v1/history`` and
``GET /v1/usage``.

``--since`` / ``--until`` take an ISO date or time (``2026-12-01``, ``2026-12-01T09:30``,
``2026-12-01 09:30:00+01:00``; without an offset: local time), a duration ago (``2h``, ``7d``,
``1h30m``, ``90`` = 90 s; the forms ``--time-limit`` takes), ``now``, or ``all`` (no bound).
A tenant sees only its own jobs; the admin all, or one tenant's with ``--tenant``.

GPU-hours count GPU-equivalents: a whole GPU 1, a fractional share its fraction, a MIG instance
its compute slices out of 7 (1g = 1/7, 3g = 3/7), as the quota is charged; an attempt counts
from its bind to its stop. ``-o json`` documents:

* ``history``: ``{"jobs": [HISTORY_JOB, ...], "more": N, "since": T, "until": T}``
  (HISTORY_JOB as ``GET /v1/history`` returns it; ``more``: the rows ``--limit`` left out;
  ``since`` / ``until``: the window in seconds since the epoch, null when unbounded);
* ``usage``: the object of ``GET /v1/usage``: ``{"by", "since", "until", "groups": [{"key",
  "gpu_hours", "jobs", "started", "queue_delay_p50_s", "queue_delay_p95_s"}, ...], "total"}``.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from gpufence.cli.connect import ContextOpt, DataOpt, TokenOpt, UrlOpt, client_errors, client_for
from gpufence.cli.job_verbs import check_partition
from gpufence.cli.output import Frame, LimitOpt, OutputOpt, check_format, more_footer, page_all
from gpufence.cli.output import show as show_frame
from gpufence.cli.render import Col, build_table, styled, when
from gpufence.cli.units import format_duration, parse_duration

BY = ("tenant", "partition", "class")
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}([T ].*)?")


def parse_when(text: str, now: float, flag: str) -> float | None:
    """Seconds since the epoch of a ``--since`` / ``--until`` value (None: ``all``)."""
    t = text.strip()
    if t.lower() == "all":
        return None
    if t.lower() == "now":
        return now
    if _ISO.fullmatch(t):
        try:
            return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
        except ValueError as exc:
            msg = f"{text!r} is not a date or time: {exc}"
            raise typer.BadParameter(msg, param_hint=flag) from None
    try:
        return now - parse_duration(t)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is neither a time (2026-12-01, 2026-12-01T09:30) nor a duration ago "
            "(2h, 7d, 1h30m), now or all",
            param_hint=flag,
        ) from None


def _window(since: str, until: str | None) -> tuple[float | None, float | None]:
    now = time.time()
    start = parse_when(since, now, "--since")
    end = parse_when(until, now, "--until") if until is not None else None
    if start is not None and end is not None and end <= start:
        raise typer.BadParameter(f"must be after --since ({when(start)})", param_hint="--until")
    return start, end


def gpu_hours(x: float) -> str:
    return f"{x:.2f}" if x >= 0.01 or x == 0 else f"{x:.4f}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def _delay(x: float | None) -> str:
    return "-" if x is None else format_duration(round(x, 1))


HISTORY_COLS = (
    Col("id", max_width=10),
    Col("name", max_width=14, flex=True),
    Col("tenant", max_width=10, flex=True),
    Col("partition", wide_only=True),
    Col("class", wide_only=True),
    Col("queue", wide_only=True),
    Col("state", max_width=9),
    Col("exit", justify="right"),
    Col("submitted", wide_only=True),
    Col("started", wide_only=True),
    Col("ended"),
    Col("wait", wide_only=True, justify="right"),
    Col("elapsed", justify="right"),
    Col("GPUs", justify="right"),
    Col("GPU-h", justify="right"),
    Col("attempts", wide_only=True, justify="right"),
    Col("preempted", wide_only=True, justify="right"),
    Col("request", wide_only=True),
    Col("reason", wide_only=True),
)
"""At 80 columns: id, name, tenant, state, exit, ended, elapsed, GPUs, GPU-hours; -o wide adds
the rest (partition, class, queue, submitted, started, queue delay, attempts, preemptions)."""


def _short(t: float | None) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(t)) if t else "-"


def history_table(jobs: list[dict[str, Any]], wide: bool) -> Table:
    rows: list[list[str | Text]] = []
    for j in jobs:
        code = j.get("exit_code")
        rows.append(
            [
                j["id"],
                j.get("name") or "",
                j.get("tenant", ""),
                j.get("partition") or "-",
                j.get("class", ""),
                j.get("queue") or "-",
                styled(j.get("state", "")),
                "-" if code is None else str(code),
                when(j.get("submitted_at")),
                when(j.get("started_at")),
                when(j.get("ended_at")) if wide else _short(j.get("ended_at")),
                _delay(j.get("queue_delay_s")),
                format_duration(round(float(j.get("elapsed_s") or 0.0))),
                _num(j.get("gpus")),
                gpu_hours(float(j.get("gpu_hours") or 0.0)),
                str(j.get("attempts", 0)),
                str(j.get("preemptions", 0)),
                j.get("request") or "",
                j.get("reason") or "",
            ]
        )
    return build_table(HISTORY_COLS, rows, wide)


TenantOpt = Annotated[
    str | None,
    typer.Option("--tenant", metavar="NAME", help="admin: one tenant's jobs (a tenant: its own)"),
]
UntilOpt = Annotated[
    str | None,
    typer.Option("--until", metavar="WHEN", help="end of the window (as --since) [default: now]"),
]


def history(
    since: Annotated[
        str,
        typer.Option(
            "--since",
            metavar="WHEN",
            help="jobs that ended after this (or still run): 2h, 7d, 2026-12-01T09:00, all",
        ),
    ] = "1d",
    until: UntilOpt = None,
    tenant: TenantOpt = None,
    partition: Annotated[
        str | None,
        typer.Option("--partition", metavar="NAME", help="only this partition's jobs"),
    ] = None,
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            metavar="STATE",
            help="only jobs in this state (repeatable): done, failed, cancelled, running, ...",
        ),
    ] = None,
    limit: LimitOpt = 100,
    output: OutputOpt = "table",
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Accounting per job (like sacct): state, exit code, queue delay, elapsed, GPUs, GPU-hours,
    attempts and preemptions of the jobs whose life overlaps the window, in submission order."""
    fmt = check_format(output)
    if limit < 0:
        raise typer.BadParameter("must be >= 0 (0: all)", param_hint="--limit")
    start, end = _window(since, until)
    client = client_for(url, token, data, context)
    with client_errors():
        if partition is not None:
            check_partition(client, partition)
        jobs, more, _ = page_all(
            lambda after, n: client.history(start, end, tenant, partition, state or (), n, after),
            limit,
        )
    frame = Frame(
        {"jobs": jobs, "more": more, "since": start, "until": end},
        lambda wide: history_table(jobs, wide),
        more_footer(more, limit),
        None if jobs else f"no jobs since {when(start) if start else 'the start'}",
    )
    show_frame(frame, fmt)


USAGE_COLS = (
    Col("key", max_width=20),
    Col("GPU-hours", justify="right"),
    Col("jobs", justify="right"),
    Col("started", justify="right"),
    Col("wait p50", justify="right"),
    Col("wait p95", justify="right"),
)


def usage_table(doc: dict[str, Any], wide: bool) -> Table:
    rows: list[list[str | Text]] = []
    for g in [*doc["groups"], {**doc["total"], "key": Text("total", style="bold")}]:
        rows.append(
            [
                g["key"],
                gpu_hours(float(g["gpu_hours"])),
                str(g["jobs"]),
                str(g["started"]),
                _delay(g.get("queue_delay_p50_s")),
                _delay(g.get("queue_delay_p95_s")),
            ]
        )
    cols = (Col(doc["by"], max_width=20), *USAGE_COLS[1:])
    period = f"{when(doc['since']) if doc['since'] else 'the start'} - {when(doc['until'])}"
    return build_table(cols, rows, wide, title=f"GPU usage by {doc['by']}, {period}")


def usage(
    by: Annotated[
        str, typer.Option("--by", metavar="WHAT", help="group by tenant, partition or class")
    ] = "tenant",
    since: Annotated[
        str,
        typer.Option("--since", metavar="WHEN", help="start of the window: 7d, 2026-12-01, all"),
    ] = "7d",
    until: UntilOpt = None,
    tenant: TenantOpt = None,
    output: OutputOpt = "table",
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """GPU-hours held in the window (each attempt clipped to it), jobs that held GPUs, and the
    queue delay (p50, p95) of the jobs first started in it, per tenant, partition or class."""
    fmt = check_format(output)
    if by not in BY:
        raise typer.BadParameter(f"{by!r} is not one of {', '.join(BY)}", param_hint="--by")
    start, end = _window(since, until)
    client = client_for(url, token, data, context)
    with client_errors():
        doc = client.usage(by, start or 0.0, end, tenant)
    empty = None if doc["groups"] else "no GPU time and no job started in the window"
    show_frame(Frame(doc, lambda wide: usage_table(doc, wide), None, empty), fmt)
