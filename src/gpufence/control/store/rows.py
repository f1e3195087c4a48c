"""Rows of the store as the rest of the control plane sees them: ``JobRow``, ``AttemptRow``
and how they are read from SQLite."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class JobRow:
    seq: int
    id: str
    tenant: str
    spec: dict[str, Any]
    workload_class: str
    partition: str
    queue: str
    state: str
    reason: str
    message: str
    attempt: int
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    cancel_requested: bool
    name: str | None = None
    gpus: str | None = None
    """What it asks for in words ('2x 4 GPUs'); None for rows from before it was stored."""
    spec_text: str = ""
    """The spec as stored (JSON text): list pages embed it without parsing it."""
    held: bool = False
    """On hold (``gpufence hold``): pending until released."""
    held_by: str = ""
    """Who held it (a tenant, or "admin"); "" when not held or held at submit before it was
    stored."""

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "state": self.state,
            "reason": self.reason,
            "message": self.message,
            "class": self.workload_class,
            "partition": self.partition,
            "queue": self.queue,
            "attempt": self.attempt,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "exit_code": self.exit_code,
            "held": self.held,
            "spec": self.spec,
        }


@dataclass(frozen=True, slots=True)
class AttemptRow:
    job_id: str
    attempt: int
    state: str
    pool: str
    lent_from: str | None
    assignments: list[dict[str, Any]]
    devices: list[list[str]]
    started_at: float
    ended_at: float | None
    exit_codes: list[int | None] | None
    stop_reason: str | None
    requeue: bool


JOB_COLUMNS = (
    "seq, id, tenant, spec, workload_class, partition, queue, state, reason, message, attempt,"
    " submitted_at, started_at, ended_at, exit_code, cancel_requested, name, gpus, held,"
    " held_by"
)
"""In ``JobRow``'s field order: rows are read by position (a page of 1,000 jobs is read in a
few milliseconds rather than tens)."""


def job_row(r: sqlite3.Row, parse_spec: bool = True) -> JobRow:
    return JobRow(
        r[0], r[1], r[2], json.loads(r[3]) if parse_spec else {}, r[4], r[5], r[6], r[7], r[8],
        r[9], r[10], r[11], r[12], r[13], r[14], bool(r[15]), r[16], r[17], r[3], bool(r[18]),
        r[19],
    )  # fmt: skip


def select_job(conn: sqlite3.Connection, job_id: str) -> JobRow | None:
    row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,)).fetchone()
    return job_row(row) if row else None


def attempt_row(row: sqlite3.Row) -> AttemptRow:
    codes = row["exit_codes"]
    return AttemptRow(
        job_id=row["job_id"],
        attempt=row["attempt"],
        state=row["state"],
        pool=row["pool"],
        lent_from=row["lent_from"],
        assignments=json.loads(row["assignments"]),
        devices=json.loads(row["devices"]),
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        exit_codes=json.loads(codes) if codes is not None else None,
        stop_reason=row["stop_reason"],
        requeue=bool(row["requeue"]),
    )


@dataclass(frozen=True, slots=True)
class StateChange:
    """A job went from ``old`` (None: it was just added) to ``new``, with its labels as of the
    change (handed to ``Store.observers`` once its transaction has committed)."""

    job_id: str
    old: str | None
    new: str
    partition: str
    workload_class: str
    queue: str
    submitted_at: float
    started_at: float | None


Observer = Callable[[list[StateChange]], None]
