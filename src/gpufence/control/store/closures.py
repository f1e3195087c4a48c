"""Drained nodes and maintenance windows in the store (migration 9): what the operator asked
for, kept so that a restart gives the core the same drains and windows (``plane/maintenance``),
and each change written to the event log as well (the audit: who, when, what).

Times are plane-clock readings (``base/plane_clock.py``), on the same line as every other
deadline in the store, so a restart on the same boot resumes them whatever the wall clock did.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Protocol

from gpufence.state.closures import utc


class Writes(Protocol):
    def execute(self, sql: str, args: tuple[object, ...] = ()) -> sqlite3.Cursor: ...

    def log(self, t: float, job_id: str | None, kind: str, reason: str, message: str) -> None: ...


class Reads(Protocol):
    def execute(self, sql: str, args: tuple[object, ...] = ()) -> sqlite3.Cursor: ...


@dataclass(frozen=True, slots=True)
class DrainRow:
    node: str
    reason: str
    deadline: float | None
    at: float
    by: str


@dataclass(frozen=True, slots=True)
class WindowRow:
    window_id: str
    nodes: tuple[str, ...]
    start: float
    end: float
    reason: str
    at: float
    by: str


def put_drain(tx: Writes, row: DrainRow) -> None:
    tx.execute(
        "INSERT OR REPLACE INTO node_drains(node, reason, deadline, at, by) VALUES(?,?,?,?,?)",
        (row.node, row.reason, row.deadline, row.at, row.by),
    )
    until = "" if row.deadline is None else f", running work stopped by {utc(row.deadline)}"
    tx.log(row.at, None, "node-drain", row.reason, f"node {row.node} drained by {row.by}{until}")


def delete_drain(tx: Writes, node: str, at: float, by: str) -> bool:
    gone = tx.execute("DELETE FROM node_drains WHERE node = ?", (node,)).rowcount > 0
    if gone:
        tx.log(at, None, "node-undrain", "", f"node {node} undrained by {by}")
    return gone


def next_window_id(tx: Writes) -> str:
    """m1, m2, ...: never reused, also after a deletion (the counter is kept in ``meta``)."""
    row = tx.execute("SELECT value FROM meta WHERE key = 'maintenance_seq'").fetchone()
    n = int(row[0]) + 1 if row else 1
    tx.execute("INSERT OR REPLACE INTO meta(key, value) VALUES('maintenance_seq', ?)", (str(n),))
    return f"m{n}"


def put_window(tx: Writes, row: WindowRow) -> None:
    tx.execute(
        "INSERT OR REPLACE INTO maintenance(id, nodes, start, end, reason, at, by)"
        " VALUES(?,?,?,?,?,?,?)",
        (row.window_id, ",".join(row.nodes), row.start, row.end, row.reason, row.at, row.by),
    )
    tx.log(
        row.at,
        None,
        "maintenance-add",
        row.reason,
        f"maintenance {row.window_id} on {','.join(row.nodes)} from {utc(row.start)} for "
        f"{row.end - row.start:g} s, by {row.by}",
    )


def delete_window(tx: Writes, window_id: str, at: float, by: str) -> bool:
    gone = tx.execute("DELETE FROM maintenance WHERE id = ?", (window_id,)).rowcount > 0
    if gone:
        tx.log(at, None, "maintenance-delete", "", f"maintenance {window_id} deleted by {by}")
    return gone


def drains(conn: Reads) -> list[DrainRow]:
    rows = conn.execute("SELECT node, reason, deadline, at, by FROM node_drains ORDER BY node")
    return [DrainRow(r[0], r[1], r[2], r[3], r[4]) for r in rows.fetchall()]


def windows(conn: Reads) -> list[WindowRow]:
    rows = conn.execute(
        "SELECT id, nodes, start, end, reason, at, by FROM maintenance ORDER BY start, id"
    )
    return [
        WindowRow(r[0], tuple(r[1].split(",")), r[2], r[3], r[4], r[5], r[6])
        for r in rows.fetchall()
    ]
