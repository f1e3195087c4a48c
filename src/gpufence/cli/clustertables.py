"""Tables of the cluster: the GPU list (``nodes``), the fences (``partitions``), the decision log
(``events``) and one frame of ``top`` (partitions, GPU map, queue head).

Each takes the JSON the API returns; ``wide`` adds the wide-only columns and cuts nothing.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpufence.cli.jobtables import queue_table
from gpufence.cli.render import STATE_STYLE, Col, build_table

TOP_ORDER = {"running": 0, "stopping": 1, "starting": 2, "pending": 3}


def _mig_slots(g: dict[str, Any]) -> str:
    slots = g.get("mig")
    if not slots:
        return ""
    return " ".join(
        f"{s['profile']}@{s['start']}:{s['job'] or ('other' if s.get('other_tenant') else '-')}"
        for s in slots
    )


def _jobs_cell(g: dict[str, Any]) -> str:
    """The GPU's job ids; in a tenant's view other tenants' jobs are a count."""
    cell = " ".join(g.get("jobs", []))
    others = int(g.get("other_tenants_jobs", 0))
    if others:
        cell = (cell + " " if cell else "") + f"+{others} other tenant{'s' if others != 1 else ''}"
    if g.get("state") == "held":
        cell = f"held for {g.get('held_for') or 'another tenant'}'s gang"
    return cell or "-"


NODE_COLS = (
    Col("node", max_width=20),
    Col("GPU", justify="right"),
    Col("type", max_width=12),
    Col("rack", wide_only=True),
    Col("NVLink", wide_only=True, justify="right"),
    Col("partition", max_width=14),
    Col("state", max_width=10),
    Col("jobs", max_width=24),
    Col("MIG slots", flex=True),
    Col("notes", flex=True),
)


def nodes_table(nodes: list[dict[str, Any]], wide: bool = False) -> Table:
    rows: list[list[str | Text]] = []
    for n in nodes:
        node_name = n["name"] + (" (fake)" if n.get("fake") else "")
        if not n.get("up", True):
            node_name += " DOWN"
        for i, g in enumerate(n["gpus"]):
            used = g.get("milli_used", 0)
            state = g["state"]
            share = f" {used / 1000:.2f}" if 0 < used < 1000 and not g.get("mig") else ""
            rows.append(
                [
                    node_name if i == 0 else "",
                    str(g["index"]),
                    g["type"],
                    str(n.get("rack") or "-"),
                    str(g.get("nvlink_domain", "-")),
                    g["partition"] or "-",
                    Text(state + share, style=STATE_STYLE.get(state, "")),
                    _jobs_cell(g),
                    _mig_slots(g),
                    gpu_notes(g),
                ]
            )
    return build_table(NODE_COLS, rows, wide, title="GPUs")


def gpu_notes(g: dict[str, Any]) -> str:
    """What the GPU side says about a real GPU: refused, MIG errors, MPS, foreign processes."""
    parts: list[str] = []
    if g.get("refused"):
        parts.append(f"REFUSED: {g['refused']}")
    if g.get("mig_status"):
        parts.append(str(g["mig_status"]))
    if g.get("mig_error"):
        parts.append(f"MIG re-partition failed {g.get('mig_failures', 1)}x: {g['mig_error']}")
    if g.get("mps"):
        restarts = g.get("mps_restarts")
        parts.append(f"MPS {g['mps']}" + (f" ({restarts} restarts)" if restarts else ""))
    for f in g.get("foreign", []):
        who = f" {f['user']}: {f['command']}" if "user" in f else ""
        pid = f" pid {f['pid']}" if "pid" in f else ""
        parts.append(f"FOREIGN process{pid}{who} [{f['action']}]")
    if "utilization" in g:
        parts.append(f"util {float(g['utilization']):.0%}")
    return "; ".join(parts)


def _not_enforced(p: dict[str, Any]) -> bool:
    """A partition whose sharing real GPUs do not enforce (fake GPUs enforce nothing anyway)."""
    how = str(p.get("enforcement", ""))
    return p.get("enforced") is False and not how.startswith("fake GPUs")


def unenforced(parts: list[dict[str, Any]]) -> list[str]:
    """One line per partition whose sharing is not enforced on the device, saying why."""
    return [
        f"partition {p['name']} ({p['sharing']}): {p['enforcement']}"
        for p in parts
        if _not_enforced(p)
    ]


PARTITION_COLS = (
    Col("partition", max_width=16),
    Col("sharing", max_width=11),
    Col("GPUs", justify="right"),
    Col("used", justify="right"),
    Col("lent", justify="right"),
    Col("borrow", justify="right"),
    Col("gang", justify="right"),  # the largest gang it can still place
    Col("run", justify="right"),
    Col("pend", justify="right"),
    Col("admits", flex=True),
)


def partitions_table(parts: list[dict[str, Any]], wide: bool = False) -> Table:
    rows: list[list[str | Text]] = []
    for p in parts:
        cap = p["capacity_gpus"]
        used = float(p["used_gpus"])
        pct = f" ({used / cap:.0%})" if cap else ""
        rows.append(
            [
                p["name"],
                p["sharing"] + (" (NOT enforced)" if _not_enforced(p) else ""),
                str(cap),
                f"{used:g}{pct}",
                str(p["lent_gpus"]),
                str(p["borrowed_gpus"]),
                str(p["largest_gang"]),
                str(p["running"]),
                str(p["pending"]),
                ",".join(p["admits"]),
            ]
        )
    return build_table(PARTITION_COLS, rows, wide, title="partitions (fences)")


EVENT_COLS = (
    Col("seq", justify="right"),
    Col("time", max_width=19),
    Col("job", max_width=12),
    Col("kind", max_width=16),
    Col("reason", max_width=20),
    Col("message", flex=True),
)


def events_table(events: list[dict[str, Any]], wide: bool = False) -> Table:
    rows: list[list[str | Text]] = []
    for e in events:
        t = e.get("t")
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(t)) if t else "-"
        if wide and t:
            millis = f".{int(t % 1 * 1000):03d}"
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + millis
        rows.append(
            [
                str(e.get("seq", "")),
                stamp,
                e.get("job_id") or "-",
                str(e.get("kind", "")),
                str(e.get("reason") or ""),
                str(e.get("message") or ""),
            ]
        )
    return build_table(EVENT_COLS, rows, wide, title="events")


def gpu_map(nodes: list[dict[str, Any]]) -> Table:
    """One line per node, one cell per GPU: the job on it, or '.' when free."""
    table = Table(title="GPU map", show_header=False, box=None, padding=(0, 1))
    table.add_column("node", style="bold", no_wrap=True)
    table.add_column("gpus")
    for n in nodes:
        cells = Text()
        for g in n["gpus"]:
            jobs = list(g.get("jobs", []))
            if g.get("other_tenants_jobs"):
                jobs.append("other")  # another tenant's job: counted, never named
            label = ",".join(jobs) if jobs else "."
            if g["state"] == "held":  # idle, kept for a waiting gang
                label = f"held:{g.get('held_for') or 'other'}"
            cells.append(f"[{g['index']}:{label}]", style=STATE_STYLE.get(g["state"], ""))
            cells.append(" ")
        table.add_row(n["name"], cells)
    return table


def top_head(jobs: list[dict[str, Any]], head: int) -> list[dict[str, Any]]:
    """The jobs ``top`` shows: running first, then stopping, starting, pending; by submission."""
    ordered = sorted(jobs, key=lambda j: (TOP_ORDER.get(j["state"], 9), j.get("seq", 0)))
    return ordered[:head]


def top_frame(
    url: str,
    parts: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    head: int,
    wide: bool = False,
) -> Group:
    shown = top_head(jobs, head)
    title = f"queue head ({len(shown)} of {len(jobs)} active)"
    stamp = Text(f"gpufence top  {url}  {time.strftime('%H:%M:%S')}", style="bold")
    return Group(
        stamp,
        partitions_table(parts, wide),
        gpu_map(nodes),
        queue_table(shown, wide, title),
    )
