"""Read-only queries of the store (``Reader``): API handlers, the dashboard, ``advise`` and
accounting each open their own read-only connection (``Store.reader()``), so they read while
the reconciler writes (WAL) and never take the writer's lock.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufence.control.store import accounting, names
from gpufence.control.store.errors import unavailable
from gpufence.control.store.rows import (
    JOB_COLUMNS,
    AttemptRow,
    JobRow,
    attempt_row,
    job_row,
    select_job,
)

PAGE_FILTERS = ("partition", "tenant", "queue", "workload_class")
"""Columns ``Reader.page`` filters on (exact match)."""


class Reader:
    """Read-only queries; one per thread (API handlers open their own)."""

    def __init__(self, path: Path) -> None:
        try:
            self._c = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
        except sqlite3.Error as exc:
            raise unavailable(exc) or exc from None
        self._c.row_factory = sqlite3.Row

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, _tb: object) -> None:
        self._c.close()
        if isinstance(exc, sqlite3.Error):
            gone = unavailable(exc)
            if gone is not None:  # a fault of the medium: 503 with the reason, not a 500
                raise gone from exc

    def job(self, job_id: str) -> JobRow | None:
        return select_job(self._c, job_id)

    def execute(self, sql: str, args: Sequence[object] = ()) -> sqlite3.Cursor:
        """A read-only query of its own."""
        return self._c.execute(sql, args)

    def resolve_ref(self, tenant: str, ref: str) -> list[names.Named]:
        """The jobs an id or a name denotes for ``tenant`` (``names.resolve``)."""
        return names.resolve(self._c.execute, tenant, ref)

    def jobs(
        self,
        *,
        states: Sequence[str] = (),
        partition: str | None = None,
        tenant: str | None = None,
        limit: int = 1000,
        after_seq: int = 0,
        parse_spec: bool = True,
    ) -> list[JobRow]:
        """A page in submission order; ``parse_spec=False`` leaves ``spec`` empty (its text is
        in ``spec_text``)."""
        where: list[str] = ["seq > ?"]
        args: list[object] = [after_seq]
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            args += list(states)
        if partition:
            where.append("partition = ?")
            args.append(partition)
        if tenant:
            where.append("tenant = ?")
            args.append(tenant)
        sql = f"SELECT {JOB_COLUMNS} FROM jobs WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?"
        return [job_row(r, parse_spec) for r in self._c.execute(sql, (*args, limit))]

    def history(self, **query: Any) -> list[dict[str, Any]]:
        """``accounting.history`` (``gpufence history``) through this reader."""
        return accounting.history(self._c, **query)

    def history_json(self, **query: Any) -> tuple[list[str], int | None]:
        """``accounting.history_json``: the page as JSON texts, and the last ``seq``."""
        return accounting.history_json(self._c, **query)

    def accounting_usage(self, **query: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """``accounting.usage`` (``gpufence usage``) through this reader."""
        return accounting.usage(self._c, **query)

    def page(
        self,
        *,
        states: Sequence[str] = (),
        filters: dict[str, str] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[int, list[JobRow]]:
        """(how many jobs match, one page of them in submission order): the dashboard's queue.
        ``filters``: exact matches on ``partition``, ``tenant``, ``queue``, ``workload_class``."""
        where: list[str] = ["1"]
        args: list[object] = []
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            args += list(states)
        for col, value in (filters or {}).items():
            if col not in PAGE_FILTERS:
                raise ValueError(f"no job filter {col!r} (valid: {', '.join(PAGE_FILTERS)})")
            where.append(f"{col} = ?")
            args.append(value)
        cond = " AND ".join(where)
        total = int(self._c.execute(f"SELECT COUNT(*) FROM jobs WHERE {cond}", args).fetchone()[0])
        sql = f"SELECT {JOB_COLUMNS} FROM jobs WHERE {cond} ORDER BY seq LIMIT ? OFFSET ?"
        return total, [job_row(r) for r in self._c.execute(sql, (*args, limit, offset))]

    def attempts(self, job_id: str) -> list[AttemptRow]:
        rows = self._c.execute(
            "SELECT * FROM attempts WHERE job_id=? ORDER BY attempt", (job_id,)
        ).fetchall()
        return [attempt_row(r) for r in rows]

    def attempt(self, job_id: str, attempt: int) -> AttemptRow | None:
        row = self._c.execute(
            "SELECT * FROM attempts WHERE job_id=? AND attempt=?", (job_id, attempt)
        ).fetchone()
        return attempt_row(row) if row else None

    def events(
        self, *, job_id: str | None = None, after_seq: int = 0, limit: int = 1000
    ) -> list[dict[str, Any]]:
        sql = "SELECT * FROM events WHERE seq > ?"
        args: list[object] = [after_seq]
        if job_id is not None:
            sql += " AND job_id = ?"
            args.append(job_id)
        sql += " ORDER BY seq LIMIT ?"
        return [dict(r) for r in self._c.execute(sql, (*args, limit))]

    # -- history for advice (gpufence advise): everything that overlaps [since, now]
    def jobs_since(self, since: float) -> list[JobRow]:
        """Jobs still open, or ended at or after ``since``, in submission order."""
        # by position, as JOB_COLUMNS lists them (``SELECT *`` has the table's order)
        sql = f"SELECT {JOB_COLUMNS} FROM jobs WHERE ended_at IS NULL OR ended_at >= ? ORDER BY seq"
        return [job_row(r) for r in self._c.execute(sql, (since,))]

    def attempts_since(self, since: float) -> list[AttemptRow]:
        sql = "SELECT * FROM attempts WHERE ended_at IS NULL OR ended_at >= ?"
        rows = self._c.execute(sql + " ORDER BY job_id, attempt", (since,))
        return [attempt_row(r) for r in rows]

    def events_since(self, since: float, kinds: Sequence[str]) -> list[dict[str, Any]]:
        """Decision-log entries of these kinds at or after ``since``, in log order."""
        marks = ",".join("?" * len(kinds))
        sql = f"SELECT * FROM events WHERE t >= ? AND kind IN ({marks}) ORDER BY seq"
        return [dict(r) for r in self._c.execute(sql, (since, *kinds))]

    def usage(self) -> tuple[dict[str, float], float] | None:
        """The last saved fair-share usage per queue and when it was saved; None if never."""
        rows = self._c.execute("SELECT queue, usage, at FROM fair_share").fetchall()
        if not rows:
            return None
        return {r["queue"]: float(r["usage"]) for r in rows}, max(float(r["at"]) for r in rows)

    def preemptions(self) -> dict[str, list[float]]:
        """The saved budget windows (``Tx.save_preemptions``); empty if never saved or if
        what is there is not a mapping of partition -> list of times."""
        return self._windows("preemptions")

    def defrags(self) -> dict[str, list[float]]:
        """The saved MIG defrag budget windows (``Tx.save_defrags``), as ``preemptions``."""
        return self._windows("mig-defrags")

    def _windows(self, key: str) -> dict[str, list[float]]:
        row = self._c.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        try:
            raw = json.loads(row["value"]) if row else {}
        except ValueError:
            return {}
        if not isinstance(raw, dict):
            return {}
        return {
            str(p): [float(t) for t in ts if isinstance(t, int | float)]
            for p, ts in raw.items()
            if isinstance(ts, list)
        }

    def idempotency_key_used(self, tenant: str, key: str) -> bool:
        """Whether ``tenant`` submitted with ``key`` before (``Tx.idempotent`` says which job)."""
        sql = "SELECT 1 FROM idempotency WHERE tenant=? AND key=?"
        return self._c.execute(sql, (tenant, key)).fetchone() is not None

    def counts(self) -> dict[str, int]:
        rows = self._c.execute("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state")
        return {r["state"]: r["n"] for r in rows}
