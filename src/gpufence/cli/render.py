"""How the CLI shows things: consoles, state colours, times, and one way to build a table.

* Consoles: stdout at the terminal's width (``$COLUMNS`` when set; 160 when stdout is not a
  terminal, so logs of CI runs stay readable); no colour when stdout is not a terminal or
  ``$NO_COLOR`` is set (rich honours both).
* Tables (``build_table``): in ``table`` mode every cell stays on one line and a column too wide
  for the terminal is cut with ``…`` (so an 80-column terminal shows one line per row); in
  ``wide`` mode the columns marked ``wide_only`` are added and nothing is cut: ``print_wide``
  prints the table at its natural width, however wide the terminal.

The tables of each verb group are in ``jobtables.py`` and ``clustertables.py``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpufence.model import lifecycle
from gpufence.model.lifecycle import JobState

# the states of the core's one job lifecycle table (model/lifecycle.py)
ACTIVE_STATES = lifecycle.LIVE_STATES
TERMINAL_STATES = lifecycle.TERMINAL_STATES
STATE_STYLE: dict[str, str] = {
    JobState.PENDING: "yellow",
    JobState.STARTING: "cyan",
    JobState.RUNNING: "green",
    JobState.STOPPING: "magenta",
    JobState.DONE: "dim green",
    JobState.FAILED: "red",
    JobState.CANCELLED: "dim",
    JobState.RECLAIMED: "magenta",
    JobState.REJECTED: "red",
    "free": "dim",
    "held": "yellow",  # idle, kept for a waiting gang
    "used": "green",
    "down": "red",
    "refused": "red",
}
PIPE_WIDTH = 160


def _width() -> int | None:
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    return None if sys.stdout.isatty() else PIPE_WIDTH


def out_console(width: int | None = None) -> Console:
    return Console(width=width or _width(), highlight=False)


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def styled(state: str) -> Text:
    return Text(state, style=STATE_STYLE.get(state, ""))


def age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


# states whose stored reason says something (why it waits, failed, is stopping or was reclaimed)
_SHOWS_REASON = (
    JobState.PENDING,
    JobState.FAILED,
    JobState.REJECTED,
    JobState.STOPPING,
    JobState.RECLAIMED,
)


def job_reason(job: dict[str, Any]) -> str:
    pending = job.get("pending")
    if isinstance(pending, dict):
        return f"{pending.get('reason', '')}: {pending.get('message', '')}".strip(": ")
    if job.get("state") in _SHOWS_REASON:
        reason, msg = job.get("reason") or "", job.get("message") or ""
        return f"{reason}: {msg}".strip(": ")
    return ""


@dataclass(frozen=True, slots=True)
class Col:
    """A table column: ``wide_only`` columns appear with ``-o wide``; ``max_width`` caps it in
    ``table`` mode (the rest is cut with …); ``flex`` columns (free text: reasons, messages)
    share the width the others leave when the table is wider than the terminal."""

    name: str
    wide_only: bool = False
    max_width: int | None = None
    justify: str = "left"
    flex: bool = False


Cell = str | Text


def build_table(
    cols: Sequence[Col],
    rows: Sequence[Sequence[Cell]],
    wide: bool = False,
    title: str | None = None,
) -> Table:
    """A table of ``rows`` (one cell per column of ``cols``, wide-only ones included)."""
    shown = [i for i, c in enumerate(cols) if wide or not c.wide_only]
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
    for i in shown:
        c = cols[i]
        table.add_column(
            c.name,
            no_wrap=True,
            overflow="fold" if wide else "ellipsis",
            max_width=None if wide else c.max_width,
            justify=c.justify,  # type: ignore[arg-type]
        )
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    if not wide:
        natural = [
            max([cell_len(cols[i].name), *(_cell_width(row[i]) for row in rows)]) for i in shown
        ]
        widths = fit_widths(
            natural,
            [cols[i].max_width for i in shown],
            [cols[i].flex for i in shown],
            # SIMPLE_HEAD, no edge padding: an edge each side, a separator between columns, one
            # space of padding each side of every column but the outer sides
            out_console().width - (3 * len(shown) - 1),
        )
        for column, width in zip(table.columns, widths, strict=True):
            column.width = width
    return table


def _cell_width(cell: Cell) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(cell)


MIN_WIDTH = 6  # a cut column keeps this much (or all of it, when shorter): "train…"


def fit_widths(
    natural: Sequence[int], caps: Sequence[int | None], flex: Sequence[bool], room: int
) -> list[int]:
    """Column widths for ``room`` characters: each column its natural width (at most its cap);
    when that is too wide, the flex columns (free text) give way first, down to ``MIN_WIDTH``,
    then the widest of the others, one character at a time, down to ``MIN_WIDTH``. Short
    columns (ids, states, numbers) are never cut before the long ones."""
    widths = [min(n, c) if c else n for n, c in zip(natural, caps, strict=True)]
    floor = [min(w, MIN_WIDTH) for w in widths]
    excess = sum(widths) - room
    for i in sorted(range(len(widths)), key=lambda i: -widths[i]):
        if excess <= 0:
            break
        if flex[i]:
            cut = min(excess, widths[i] - floor[i])
            widths[i] -= cut
            excess -= cut
    while excess > 0:
        i = max(range(len(widths)), key=lambda i: widths[i] - floor[i])
        if widths[i] <= floor[i]:
            break  # nothing left to cut: the terminal is narrower than the minimum
        widths[i] -= 1
        excess -= 1
    return widths


def print_wide(renderable: RenderableType, wide: bool) -> None:
    """Print to stdout; ``wide``: at the renderable's natural width (nothing cut or wrapped)."""
    console = out_console()
    if wide:
        unbounded = console.options.update(max_width=1 << 16)
        natural = Measurement.get(console, unbounded, renderable).maximum
        if natural > console.width:
            console = out_console(width=natural)
    console.print(renderable)
