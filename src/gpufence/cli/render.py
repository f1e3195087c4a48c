"""How the control-plane verbs of the CLI show things: consoles, job-state styles, tables, top.

Each table takes the JSON the API returns (``gpufence.control.views``); ``top_frame`` is one frame
of ``gpufence top`` (partitions, GPU map, queue head).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from gpufence.control.http.client import Client
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
    "used": "green",
    "down": "red",
}


def out_console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


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


def queue_table(jobs: list[dict[str, Any]], title: str | None = None) -> Table:
    now = time.time()
    table = Table(title=title, expand=False)
    for col in ("id", "tenant", "class", "partition", "state", "GPUs", "age", "name", "reason"):
        table.add_column(col, overflow="fold")
    for j in jobs:
        running = j.get("state") in (JobState.RUNNING, JobState.STOPPING)
        start = j.get("started_at") if running else None
        table.add_row(
            j["id"],
            j.get("tenant", ""),
            j.get("class", ""),
            j.get("partition") or "-",
            styled(j.get("state", "")),
            j.get("gpus", ""),
            age(now - (start or j.get("submitted_at") or now)),
            j.get("name") or "",
            job_reason(j),
        )
    return table


def attempts_table(attempts: list[dict[str, Any]]) -> Table:
    """A job's attempts: where each ran (partition, devices), when, and how it ended."""
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
            when(a.get("started_at")),
            when(a.get("ended_at")),
            "-" if codes is None else " ".join(str(c) for c in codes),
            stop,
        )
    return table


def fair_share_table(
    fair: list[dict[str, Any]], partition: str | None, own_queue: str | None
) -> Table:
    """A partition's fair-share order (``explain``); ``own_queue`` is marked with a *."""
    table = Table(title=f"fair share in {partition}")
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
        mark = " *" if t["queue"] == own_queue else ""
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
    return table


def _mig_slots(g: dict[str, Any]) -> str:
    slots = g.get("mig")
    if not slots:
        return ""
    return " ".join(f"{s['profile']}@{s['start']}:{s['job'] or '-'}" for s in slots)


def nodes_table(nodes: list[dict[str, Any]]) -> Table:
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


def top_frame(client: Client, head: int) -> Group:
    parts = client.partitions()
    ns = client.nodes()
    jobs = client.jobs(ACTIVE_STATES, limit=max(head, 1) * 4)
    order = {JobState.RUNNING: 0, JobState.STOPPING: 1, JobState.STARTING: 2, JobState.PENDING: 3}
    jobs.sort(key=lambda j: (order.get(j["state"], 9), j.get("seq", 0)))
    shown = jobs[:head]
    title = f"queue head ({len(shown)} of {len(jobs)} active)"
    stamp = Text(f"gpufence top  {client.url}  {time.strftime('%H:%M:%S')}", style="bold")
    return Group(stamp, _partitions_table(parts), _gpu_map(ns), queue_table(shown, title))
