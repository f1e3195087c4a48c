"""``gpufence status ARRAY``: an array as a whole (its id, or a name that denotes its tasks).

Slurm shows an array's tasks as ``4_0``, ``4_1``, ...; so does this (``j4_0``), next to each
task's own id, with how many tasks stand in each state. ``-o json``: ``{"array": ID, "states":
{STATE: N}, "tasks": [{"task": "j4_0", "id", "state", "exit_code", "reason"}, ...]}``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from gpufence.cli.output import Frame, show
from gpufence.cli.render import Col, build_table, job_reason, styled
from gpufence.control.http.client import Client

TASK_COLS = (
    Col("task"),
    Col("id"),
    Col("state", max_width=10),
    Col("exit", justify="right"),
    Col("reason", flex=True),
)


def one_array(named: list[dict[str, Any]]) -> str | None:
    """The array every job of ``named`` (``Client.named``) is a task of, or None."""
    arrays = {j.get("array") for j in named}
    if len(named) < 2 or len(arrays) != 1:
        return None
    array = arrays.pop()
    return str(array) if array else None


def task_label(array: str, named: dict[str, Any]) -> str:
    index = named.get("index")
    return f"{array}_{index}" if isinstance(index, int) else str(named["id"])


def show_array(client: Client, array: str, named: list[dict[str, Any]], fmt: str) -> None:
    """Print the array ``array`` whose tasks ``named`` lists (in index order)."""
    tasks = []
    for n in named:
        j = client.job(str(n["id"]))
        tasks.append(
            {
                "task": task_label(array, n),
                "id": j["id"],
                "state": j["state"],
                "exit_code": j.get("exit_code"),
                "reason": job_reason(j),
            }
        )
    states = dict(Counter(str(t["state"]) for t in tasks))
    doc = {"array": array, "states": states, "tasks": tasks}

    def draw(wide: bool) -> RenderableType:
        counts = ", ".join(f"{n} {s}" for s, n in states.items())
        rows: list[list[str | Text]] = [
            [
                str(t["task"]),
                str(t["id"]),
                styled(str(t["state"])),
                "" if t["exit_code"] is None else str(t["exit_code"]),
                str(t["reason"]),
            ]
            for t in tasks
        ]
        head = Text.assemble((f"array {array}", "bold"), f": {len(tasks)} task(s), {counts}")
        return Group(head, build_table(TASK_COLS, rows, wide))

    show(Frame(doc, draw), fmt)
