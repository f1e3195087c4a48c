"""Client verbs about the cluster: ``nodes``, ``partitions``, ``events``, ``top``, ``advise``.

``-o json`` documents (the API's objects):

* ``nodes``: ``{"nodes": [NODE, ...]}`` (NODE as in ``GET /v1/nodes``; in a tenant's view other
  tenants' jobs are counts: ``other_tenants_gpus`` per node, ``other_tenants_jobs`` per GPU);
* ``partitions``: ``GET /v1/partitions``: ``{"partitions": [PARTITION, ...]}``;
* ``events``: ``{"events": [EVENT, ...], "more": N, "next_after": SEQ}``: the last ``--limit``
  events after ``--after`` (``more``: the earlier ones left out; ``next_after``: pass it as
  ``--after`` to get only newer ones);
* ``top``: ``{"partitions": [...], "nodes": [...], "jobs": [...]}`` (the active jobs it shows);
* ``advise``: ``GET /v1/advice``: ``{"advice": [...], "scope", "spec"}``.
"""

from __future__ import annotations

import collections
from typing import Annotated, Any

import typer
from rich.text import Text

from gpufence.advice.present import json_text
from gpufence.cli.clustertables import (
    events_table,
    nodes_table,
    partitions_table,
    top_frame,
    top_head,
    unenforced,
)
from gpufence.cli.connect import ContextOpt, DataOpt, TokenOpt, UrlOpt, client_errors, client_for
from gpufence.cli.output import (
    PAGE_MAX,
    CountOpt,
    Frame,
    IntervalOpt,
    LimitOpt,
    OutputOpt,
    WatchFlag,
    check_format,
    check_watch,
    document_text,
    show,
    watch,
)
from gpufence.cli.render import ACTIVE_STATES, err_console, out_console
from gpufence.control.http.client import Client


def _show_or_watch(fetch: Any, fmt: str, watching: bool, interval: float, count: int) -> None:
    with client_errors():
        if watching:
            watch(fetch, fmt, interval, count)
        else:
            show(fetch(), fmt)


def nodes(
    output: OutputOpt = "table",
    watching: WatchFlag = False,
    interval: IntervalOpt = 2.0,
    count: CountOpt = 0,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """The GPU map: every GPU with its partition, state, job(s), MIG slots and notes (refused,
    MPS, foreign processes); then each partition whose sharing is not enforced on the device."""
    fmt = check_format(output)
    client = client_for(url, token, data, context)

    def fetch() -> Frame:
        ns = client.nodes()
        doc = {"nodes": ns}
        lines = unenforced(client.partitions())  # e.g. fractional shares without MPS
        others = sum(int(n.get("other_tenants_gpus", 0)) for n in ns)
        if others:  # a tenant's view: other tenants' jobs are counted, not named
            lines.append(f"{others} GPU{'s' if others != 1 else ''} held by other tenants")
        footer = "\n".join(lines) or None
        return Frame(doc, lambda wide: nodes_table(ns, wide), footer)

    _show_or_watch(fetch, fmt, watching, interval, count)


def partitions(
    output: OutputOpt = "table",
    watching: WatchFlag = False,
    interval: IntervalOpt = 2.0,
    count: CountOpt = 0,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """The partitions (fences): capacity, used, lent and borrowed GPUs, the largest gang each
    can still place, running and pending jobs."""
    fmt = check_format(output)
    client = client_for(url, token, data, context)

    def fetch() -> Frame:
        parts = client.partitions()
        return Frame({"partitions": parts}, lambda wide: partitions_table(parts, wide))

    _show_or_watch(fetch, fmt, watching, interval, count)


def events(
    job: Annotated[
        str | None,
        typer.Option("--job", metavar="JOB", help="only this job's events (tenants: required)"),
    ] = None,
    after: Annotated[
        int, typer.Option("--after", metavar="SEQ", help="only events after this sequence number")
    ] = 0,
    limit: LimitOpt = 50,
    output: OutputOpt = "table",
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """The decision log: binds, stops, notices, requeues, exits, rejects, with their reasons
    (the latest --limit; all of them for the admin, one job's with --job)."""
    fmt = check_format(output)
    if limit < 0 or after < 0:
        raise typer.BadParameter("must be >= 0", param_hint="--limit / --after")
    client = client_for(url, token, data, context)
    with client_errors():
        rows, more, last = _tail(client, job, after, limit)
    footer = None
    if more:
        footer = f"{more} earlier (use --limit {limit + more}, --limit 0 for all, or --after SEQ)"
    frame = Frame(
        {"events": rows, "more": more, "next_after": last},
        lambda wide: events_table(rows, wide),
        footer,
        None if rows else "no events" + (f" for {job}" if job else ""),
    )
    show(frame, fmt)


def _tail(
    client: Client, job: str | None, after: int, limit: int
) -> tuple[list[dict[str, Any]], int, int]:
    """The last ``limit`` events after ``after`` (0: all), how many earlier ones were left
    out, and the last sequence number."""
    keep: collections.deque[dict[str, Any]] = collections.deque(maxlen=limit or None)
    seen = 0
    cursor = after
    while True:
        rows = client.events(job, cursor, PAGE_MAX)
        seen += len(rows)
        keep.extend(rows)
        if rows:
            cursor = int(rows[-1]["seq"])
        if len(rows) < PAGE_MAX:
            return list(keep), seen - len(keep), cursor


def top(
    once: Annotated[bool, typer.Option("--once", help="print one frame and exit")] = False,
    interval: IntervalOpt = 1.0,
    head: Annotated[int, typer.Option("--head", metavar="N", help="jobs shown")] = 15,
    count: CountOpt = 0,
    output: OutputOpt = "table",
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Live view: partitions (fences), GPU map, queue head; Ctrl-C quits (-o json / yaml: one
    snapshot, or one per refresh with --count)."""
    fmt = check_format(output)
    check_watch(interval, count)
    client = client_for(url, token, data, context)

    def fetch() -> Frame:
        parts = client.partitions()
        ns = client.nodes()
        jobs = client.jobs(ACTIVE_STATES, limit=max(head, 1) * 4)
        doc = {"partitions": parts, "nodes": ns, "jobs": top_head(jobs, head)}
        return Frame(doc, lambda wide: top_frame(client.url, parts, ns, jobs, head, wide))

    single = once or (fmt in ("json", "yaml") and not count)
    _show_or_watch(fetch, fmt, not single, interval, count)


def advise(
    as_json: Annotated[bool, typer.Option("--json", help="the same as -o json")] = False,
    output: OutputOpt = "table",
    strict: Annotated[
        bool, typer.Option("--strict", help="exit 2 when there is any warning (for CI / cron)")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Capacity advice from the control plane's own history: chronic preemption (and how big
    the serving fence should be), batch work in the serving queue, idle notebooks, lending that
    loses work, fragmentation; plus the spec rules with the numbers the history gives. A tenant
    token gets the advice about its own jobs only."""
    fmt = "json" if as_json else check_format(output)
    client = client_for(url, token, data, context)
    with client_errors():
        res = client.advice()
    items = res.get("advice", [])
    if fmt in ("json", "yaml"):
        typer.echo(document_text(res, fmt).rstrip("\n"))
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
