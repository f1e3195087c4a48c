"""``-o table|wide|json|yaml``, ``--watch``, ``--limit`` and the "N more" footer, for every list
and show verb.

A verb builds a ``Frame``: the document ``-o json`` / ``-o yaml`` print (the API's objects in a
small envelope; the schema per verb is in the README, "Machine-readable output"), a function
that draws the table (``wide`` or not), and the footer for the terminal. ``show`` prints one
frame; ``watch`` fetches and prints a frame every ``--interval`` seconds until Ctrl-C or
``--count`` frames: in a terminal the table is redrawn in place; otherwise each frame is printed
after the last (``-o json``: one compact document per line; ``-o yaml``: documents separated by
``---``), so a script can read every refresh.

Lists page through the API's ``after`` cursor (``page_all``): nothing is cut silently; what
``--limit`` leaves out is counted in the footer ("12 more (use --limit 0 for all)") and in the
document's ``more``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer
import yaml
from rich.console import Group, RenderableType
from rich.text import Text

from gpufence.cli.render import err_console, out_console, print_wide

FORMATS = ("table", "wide", "json", "yaml")
PAGE_MAX = 10_000  # the API's largest page (limit <= 10000)

OutputOpt = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        metavar="FORMAT",
        help="table (cut to the terminal's width), wide (more columns, nothing cut), json or "
        "yaml (the API's objects; schema in the README, Machine-readable output)",
    ),
]
WatchOpt = Annotated[
    bool,
    typer.Option(
        "--watch",
        "-w",
        help="refresh every --interval seconds until Ctrl-C (json: one document per line)",
    ),
]
WatchFlag = Annotated[
    bool, typer.Option("--watch", "-w", help="refresh every --interval seconds until Ctrl-C")
]
IntervalOpt = Annotated[
    float, typer.Option("--interval", metavar="SECONDS", help="seconds between refreshes")
]
CountOpt = Annotated[
    int,
    typer.Option(
        "--count", metavar="N", help="with --watch: stop after N frames (0: until Ctrl-C)"
    ),
]
MAX_LIMIT = 1_000_000_000
LimitOpt = Annotated[
    int,
    typer.Option(
        "--limit",
        metavar="N",
        max=MAX_LIMIT,  # beyond it Python's slicing overflowed (a traceback, not an error)
        help="show at most N rows (0: all); the rest are counted in a footer",
    ),
]


@dataclass
class Frame:
    doc: dict[str, Any]
    """What ``-o json`` / ``-o yaml`` print."""
    table: Callable[[bool], RenderableType]
    """Draws the table; the argument is ``wide``."""
    footer: str | None = None
    """A line under the table (stderr), e.g. ``12 more (use --limit 0 for all)``."""
    empty: str | None = None
    """Printed (stderr) instead of the table when there is nothing to show."""


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise typer.BadParameter(
            f"{fmt!r} is not one of {', '.join(FORMATS)}", param_hint="'--output' / '-o'"
        )
    return fmt


def check_watch(interval: float, count: int) -> None:
    if interval <= 0:
        raise typer.BadParameter("must be > 0", param_hint="--interval")
    if count < 0:
        raise typer.BadParameter("must be >= 0", param_hint="--count")


def more_footer(more: int, limit: int) -> str | None:
    if more <= 0:
        return None
    return f"{more} more (use --limit {limit + more} or --limit 0 for all)"


def document_text(doc: dict[str, Any], fmt: str, compact: bool = False) -> str:
    if fmt == "json":
        if compact:
            return json.dumps(doc, separators=(",", ":"))
        return json.dumps(doc, indent=2)
    return str(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True))


def show(frame: Frame, fmt: str) -> None:
    """Print one frame in format ``fmt``."""
    if fmt in ("json", "yaml"):
        typer.echo(document_text(frame.doc, fmt).rstrip("\n"))
        return
    if frame.empty is not None:
        err_console().print(frame.empty, markup=False)
        return
    print_wide(frame.table(fmt == "wide"), fmt == "wide")
    if frame.footer:
        err_console().print(frame.footer, markup=False)


def _renderable(frame: Frame, fmt: str) -> RenderableType:
    stamp = Text(time.strftime("%H:%M:%S"), style="dim")
    if frame.empty is not None:
        return Group(stamp, Text(frame.empty))
    parts: list[RenderableType] = [stamp, frame.table(fmt == "wide")]
    if frame.footer:
        parts.append(Text(frame.footer, style="dim"))
    return Group(*parts)


def watch(fetch: Callable[[], Frame], fmt: str, interval: float, count: int) -> None:
    """Print ``fetch()`` every ``interval`` s: ``count`` frames (0: until Ctrl-C)."""
    check_watch(interval, count)
    n = 0
    try:
        if fmt in ("table", "wide") and sys.stdout.isatty():
            _watch_live(fetch, fmt, interval, count)
            return
        while True:
            frame = fetch()
            n += 1
            if fmt == "json":
                typer.echo(document_text(frame.doc, "json", compact=True))
            elif fmt == "yaml":
                typer.echo("---\n" + document_text(frame.doc, "yaml").rstrip("\n"))
            else:
                out_console().print(_renderable(frame, fmt))
            sys.stdout.flush()
            if count and n >= count:
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        pass


def _watch_live(fetch: Callable[[], Frame], fmt: str, interval: float, count: int) -> None:
    from rich.live import Live

    console = out_console()
    n = 1
    with Live(_renderable(fetch(), fmt), console=console, screen=False, auto_refresh=False) as live:
        while not count or n < count:
            time.sleep(interval)
            live.update(_renderable(fetch(), fmt), refresh=True)
            n += 1


def page_all(
    fetch_page: Callable[[int, int], list[dict[str, Any]]], limit: int, start: int = 0
) -> tuple[list[dict[str, Any]], int, int]:
    """Every item after ``start`` through the ``after`` cursor (``fetch_page(after, page_size)``,
    items with a ``seq``): the first ``limit`` (0: all), how many more there are, and the last
    ``seq`` seen."""
    shown: list[dict[str, Any]] = []
    more = 0
    after = start
    while True:
        rows = fetch_page(after, PAGE_MAX)
        for r in rows:
            if limit == 0 or len(shown) < limit:
                shown.append(r)
            else:
                more += 1
        if rows:
            after = int(rows[-1]["seq"])
        if len(rows) < PAGE_MAX:
            return shown, more, after
