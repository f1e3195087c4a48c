"""Tables of jobs: the queue, a job's attempts, a partition's fair-share order, a job's status.

Each takes the JSON the API returns (``gpufence.control.observe.views``); ``wide`` adds the
wide-only columns and cuts nothing (``render.build_table``).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from gpufence.cli.failure import exit_text, previous_attempt_line, short_code
from gpufence.cli.render import Col, age, build_table, job_reason, styled, when
from gpufence.cli.sbatch_output import shown_command
from gpufence.cli.units import format_duration, format_size

QUEUE_COLS = (
    Col("id", max_width=20),  # an array task's is "j105 j4_100"
    Col("tenant", max_width=12),
    Col("class", max_width=11),
    Col("partition", max_width=12),
    Col("state", max_width=9),
    Col("GPUs", max_width=14),
    Col("age", max_width=8, justify="right"),
    Col("name", max_width=16),
    Col("queue", wide_only=True),
    Col("priority", wide_only=True, justify="right"),
    Col("attempt", wide_only=True, justify="right"),
    Col("submitted", wide_only=True),
    Col("reason", flex=True),
    Col("command", wide_only=True, flex=True),
)


def queue_rows(jobs: list[dict[str, Any]]) -> list[list[str | Text]]:
    now = time.time()
    rows: list[list[str | Text]] = []
    for j in jobs:
        start = j.get("started_at") if j.get("state") in ("running", "stopping") else None
        spec = j.get("spec") or {}
        rows.append(
            [
                j["id"] + array_label(spec),
                j.get("tenant", ""),
                j.get("class", ""),
                j.get("partition") or "-",
                styled(j.get("state", "")),
                j.get("gpus", ""),
                age(now - (start or j.get("submitted_at") or now)),
                j.get("name") or "",
                j.get("queue") or "-",
                str(spec.get("priority", 0)),
                str(j.get("attempt", 1)),
                when(j.get("submitted_at")),
                job_reason(j),
                shown_command(spec.get("command", [])),
            ]
        )
    return rows


def array_label(spec: dict[str, Any]) -> str:
    """`` j4_3`` for task 3 of array j4 (Slurm's name for it, which every verb takes), else ""."""
    task = spec.get("array_task") or {}
    return f" {task['job']}_{task['index']}" if "job" in task and "index" in task else ""


def queue_table(jobs: list[dict[str, Any]], wide: bool = False, title: str | None = None) -> Table:
    return build_table(QUEUE_COLS, queue_rows(jobs), wide, title)


ATTEMPT_COLS = (
    Col("attempt", justify="right"),
    Col("state", max_width=10),
    Col("partition", max_width=24),
    Col("devices", max_width=24),
    Col("started", wide_only=True),
    Col("ended", wide_only=True),
    Col("ran", justify="right"),
    Col("exit codes", max_width=16),
    Col("stop", flex=True),
)


def attempts_table(attempts: list[dict[str, Any]], wide: bool = False) -> Table:
    """A job's attempts: where each ran (partition, devices), when, and how it ended."""
    rows: list[list[str | Text]] = []
    now = time.time()
    for a in attempts:
        pool = a["pool"] + (f" (lent by {a['lent_from']})" if a.get("lent_from") else "")
        devices = " ".join(
            f"r{rank}:{','.join(devs) or 'cpu'}" for rank, devs in enumerate(a["devices"])
        )
        codes = a.get("exit_codes")
        stop = a.get("stop_reason") or ""
        if stop and a.get("requeue"):
            stop += " (requeue)"
        started = a.get("started_at")
        ran = age((a.get("ended_at") or now) - started) if started else "-"
        rows.append(
            [
                str(a["attempt"]),
                a["state"],
                pool,
                devices,
                when(started),
                when(a.get("ended_at")),
                ran,
                "-" if codes is None else " ".join(short_code(c) for c in codes),
                stop,
            ]
        )
    return build_table(ATTEMPT_COLS, rows, wide, title="attempts")


FAIR_COLS = (
    Col("rank", justify="right"),
    Col("queue", max_width=16),
    Col("tenant", max_width=12),
    Col("weight", justify="right"),
    Col("holding GPUs", justify="right"),
    Col("usage GPU-h", justify="right"),
    Col("share", justify="right"),
    Col("why", flex=True),
)


def fair_share_table(
    fair: list[dict[str, Any]], partition: str | None, own_queue: str | None, wide: bool = False
) -> Table:
    """A partition's fair-share order (``explain``); ``own_queue`` is marked with a *."""
    rows: list[list[str | Text]] = []
    for t in fair:
        mark = " *" if t["queue"] == own_queue else ""
        rows.append(
            [
                str(t["rank"]),
                t["queue"] + mark,
                t.get("tenant") or "-",
                f"{t['weight']:g}",
                f"{t['holding_gpus']:g}",
                f"{t['decayed_usage_gpu_h']:.2f}",
                f"{t['share']:.3f}",
                t.get("explanation", ""),
            ]
        )
    return build_table(FAIR_COLS, rows, wide, title=f"fair share in {partition}")


def limits_text(spec: dict[str, Any]) -> str:
    """'2 CPUs, 8G memory, time limit 2h' per replica, from the stored request."""
    parts = []
    if spec.get("cpus") is not None:
        parts.append(f"{spec['cpus']:g} CPU{'s' if spec['cpus'] != 1 else ''}")
    if spec.get("mem_bytes") is not None:
        parts.append(f"{format_size(int(spec['mem_bytes']))} memory")
    if spec.get("time_limit_s") is not None:
        parts.append(f"time limit {format_duration(spec['time_limit_s'])}")
    return ", ".join(parts) or "-"


def status_grid(j: dict[str, Any], failure: str | None) -> Table:
    """The head of ``gpufence status``: one row per fact; the exit code only once the job has
    ended (a requeued job's last exit belongs to its previous attempt, shown as such)."""
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold", no_wrap=True)
    head.add_column(overflow="fold")
    spec = j.get("spec", {})
    ended = j.get("ended_at") is not None
    rows: list[tuple[str, RenderableType]] = [
        ("job", j["id"] + array_label(spec) + (f" ({j['name']})" if j.get("name") else "")),
        ("state", styled(j["state"])),
        ("tenant", j.get("tenant", "")),
        ("class", j.get("class", "")),
        ("partition / queue", f"{j.get('partition') or '-'} / {j.get('queue') or '-'}"),
        ("request", j.get("gpus", "")),
        ("limits", limits_text(spec)),
        ("command", shown_command(spec.get("command", []))),
        ("submitted", when(j.get("submitted_at"))),
        ("started", when(j.get("started_at"))),
        ("ended", when(j.get("ended_at"))),
        ("exit", exit_text(j.get("exit_code")) if ended else "-"),
        ("attempt", str(j.get("attempt", 1))),
    ]
    previous = previous_attempt_line(j)
    if previous:
        rows.append(("previous", previous))
    if failure:
        rows.append(("failure", failure))
    else:
        why = job_reason(j)
        if why:
            rows.append(("reason", why))
    for k, v in rows:
        head.add_row(k, v if not isinstance(v, str) else Text(v))
    return head
