"""The progress bar every front end shows while it waits (a sim run per policy, a demo act):
one setup, so they look alike; each caller names only what its status column says."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


def progress_bar(console: Console, status: str, transient: bool = True) -> Progress:
    """A ``Progress``: task description in bold, the bar, ``status`` (a rich format string over
    ``task``, e.g. ``"{task.percentage:>3.0f}%"``), the wall time elapsed. ``transient``: the bar
    disappears when done (the summary that follows replaces it)."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn(status),
        TimeElapsedColumn(),
        console=console,
        transient=transient,
    )
