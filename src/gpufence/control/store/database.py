"""Durable control-plane state: one SQLite file (WAL) in the data directory.

The reconciler is the only writer. It persists every transition *before* acting on it (a Bind is
written as ``starting`` before any process is spawned, a Stop as ``stopping`` before the signal),
so a ``kill -9`` at any moment leaves a store from which a restart can tell, for every job,
whether its processes may exist. API handlers read through their own connections; WAL lets them
read while the reconciler writes.

Schema changes are numbered migrations applied in order at open; ``meta.schema_version`` says
which ran. A store newer than this code is refused rather than misread.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufence.model import lifecycle
from gpufence.model.lifecycle import JobState

DB_NAME = "gpufence.db"

# Job states as the control plane reports them: the one lifecycle table of the core
# (``model/lifecycle.py``), ``starting`` included (bound and persisted, processes being spawned).
PENDING = JobState.PENDING
STARTING = JobState.STARTING
RUNNING = JobState.RUNNING
STOPPING = JobState.STOPPING
DONE = JobState.DONE
FAILED = JobState.FAILED
CANCELLED = JobState.CANCELLED
RECLAIMED = JobState.RECLAIMED
REJECTED = JobState.REJECTED
ACTIVE = lifecycle.ACTIVE
TERMINAL = lifecycle.TERMINAL_STATES
STATES = lifecycle.STATES

_MIGRATIONS: tuple[str, ...] = (
    # 1: jobs, attempts, decision/event log
    """
    CREATE TABLE jobs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        spec TEXT NOT NULL,               -- the accepted submit request, JSON
        workload_class TEXT NOT NULL,
        partition TEXT NOT NULL DEFAULT '',
        queue TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        message TEXT NOT NULL DEFAULT '',
        attempt INTEGER NOT NULL DEFAULT 1,
        submitted_at REAL NOT NULL,
        started_at REAL,
        ended_at REAL,
        exit_code INTEGER,
        cancel_requested INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_state ON jobs(state);
    CREATE INDEX jobs_tenant ON jobs(tenant);
    CREATE TABLE attempts (
        job_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        state TEXT NOT NULL,
        pool TEXT NOT NULL,
        lent_from TEXT,
        assignments TEXT NOT NULL,         -- JSON list of per-replica assignments
        devices TEXT NOT NULL,             -- JSON list of per-replica CUDA_VISIBLE_DEVICES entries
        started_at REAL NOT NULL,
        ended_at REAL,
        exit_codes TEXT,
        stop_reason TEXT,
        requeue INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (job_id, attempt)
    );
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        t REAL NOT NULL,
        job_id TEXT,
        kind TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        message TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX events_job ON events(job_id);
    """,
    # 2: fair-share usage per queue, so a restart does not forgive every tenant its history
    """
    CREATE TABLE fair_share (
        queue TEXT PRIMARY KEY,
        usage REAL NOT NULL,              -- decayed milli-GPU-seconds at ``at``
        at REAL NOT NULL
    );
    """,
)
SCHEMA_VERSION = len(_MIGRATIONS)


class StoreError(RuntimeError):
    pass


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


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode: a committed transaction survives a process crash (kill -9); only an
    # OS crash / power loss may lose the last transactions, never corrupt the file.
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def _job(row: sqlite3.Row) -> JobRow:
    return JobRow(
        seq=row["seq"],
        id=row["id"],
        tenant=row["tenant"],
        spec=json.loads(row["spec"]),
        workload_class=row["workload_class"],
        partition=row["partition"],
        queue=row["queue"],
        state=row["state"],
        reason=row["reason"],
        message=row["message"],
        attempt=row["attempt"],
        submitted_at=row["submitted_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        exit_code=row["exit_code"],
        cancel_requested=bool(row["cancel_requested"]),
    )


def _select_job(conn: sqlite3.Connection, job_id: str) -> JobRow | None:
    row = conn.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
    return _job(row) if row else None


def _attempt(row: sqlite3.Row) -> AttemptRow:
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


class Store:
    """The reconciler's writable handle; ``reader()`` gives API threads their own."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / DB_NAME
        self._conn = _connect(self.path)
        self._lock = threading.Lock()
        self._migrate()

    # ------------------------------------------------------------------ schema
    def _migrate(self) -> None:
        c = self._conn
        c.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        row = c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        version = int(row["value"]) if row else 0
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {version}, newer than this gpufence "
                f"({SCHEMA_VERSION}); upgrade gpufence or use another --data directory"
            )
        for n in range(version, SCHEMA_VERSION):
            with self.transaction() as tx:
                tx.executescript_in_tx(_MIGRATIONS[n])
                tx.execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', ?)",
                    (str(n + 1),),
                )

    def schema_version(self) -> int:
        row = self._conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row["value"]) if row else 0

    @contextmanager
    def transaction(self) -> Iterator[Tx]:
        """One atomic write; everything in it lands or nothing does."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield Tx(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def job(self, job_id: str) -> JobRow | None:
        """Read through the writer's connection (the reconciler's own reads)."""
        with self._lock:
            return _select_job(self._conn, job_id)

    def max_seq(self) -> int:
        with self._lock:
            row = self._conn.execute("SELECT MAX(seq) AS m FROM jobs").fetchone()
        return int(row["m"] or 0)

    def reader(self) -> Reader:
        return Reader(self.path)

    def close(self) -> None:
        self._conn.close()


class Tx:
    """Writes inside one transaction (only the reconciler holds one)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._c = conn

    def execute(self, sql: str, args: Sequence[object] = ()) -> sqlite3.Cursor:
        return self._c.execute(sql, args)

    def executescript_in_tx(self, script: str) -> None:
        # executescript() would COMMIT first; run the statements one by one instead
        for stmt in script.split(";"):
            if stmt.strip():
                self._c.execute(stmt)

    def job(self, job_id: str) -> JobRow:
        row = _select_job(self._c, job_id)
        if row is None:
            raise StoreError(f"job {job_id} is not in the store")
        return row

    def save_usage(self, usage: dict[str, float], at: float) -> None:
        """Replace the saved fair-share usage with this snapshot."""
        self._c.execute("DELETE FROM fair_share")
        self._c.executemany(
            "INSERT INTO fair_share(queue, usage, at) VALUES(?, ?, ?)",
            [(q, float(v), at) for q, v in sorted(usage.items())],
        )

    def add_job(
        self,
        *,
        job_id: str,
        tenant: str,
        spec: dict[str, Any],
        workload_class: str,
        partition: str,
        queue: str,
        submitted_at: float,
    ) -> None:
        self._c.execute(
            "INSERT INTO jobs(id, tenant, spec, workload_class, partition, queue, state,"
            " submitted_at) VALUES(?,?,?,?,?,?,?,?)",
            (
                job_id,
                tenant,
                json.dumps(spec, sort_keys=True),
                workload_class,
                partition,
                queue,
                PENDING,
                submitted_at,
            ),
        )

    def set_job(self, job_id: str, **fields: object) -> None:
        if not fields:
            return
        cols = ", ".join(f"{k}=?" for k in fields)
        self._c.execute(f"UPDATE jobs SET {cols} WHERE id=?", (*fields.values(), job_id))

    def add_attempt(
        self,
        *,
        job_id: str,
        attempt: int,
        pool: str,
        lent_from: str | None,
        assignments: list[dict[str, Any]],
        devices: list[list[str]],
        started_at: float,
    ) -> None:
        self._c.execute(
            "INSERT OR REPLACE INTO attempts(job_id, attempt, state, pool, lent_from,"
            " assignments, devices, started_at) VALUES(?,?,?,?,?,?,?,?)",
            (
                job_id,
                attempt,
                STARTING,
                pool,
                lent_from,
                json.dumps(assignments),
                json.dumps(devices),
                started_at,
            ),
        )

    def set_attempt(self, job_id: str, attempt: int, **fields: object) -> None:
        if "exit_codes" in fields:
            fields["exit_codes"] = json.dumps(fields["exit_codes"])
        cols = ", ".join(f"{k}=?" for k in fields)
        self._c.execute(
            f"UPDATE attempts SET {cols} WHERE job_id=? AND attempt=?",
            (*fields.values(), job_id, attempt),
        )

    def log(self, t: float, job_id: str | None, kind: str, reason: str, message: str) -> None:
        self._c.execute(
            "INSERT INTO events(t, job_id, kind, reason, message) VALUES(?,?,?,?,?)",
            (t, job_id, kind, reason, message),
        )


class Reader:
    """Read-only queries; one per thread (API handlers open their own)."""

    def __init__(self, path: Path) -> None:
        self._c = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
        self._c.row_factory = sqlite3.Row

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._c.close()

    def job(self, job_id: str) -> JobRow | None:
        return _select_job(self._c, job_id)

    def jobs(
        self,
        *,
        states: Sequence[str] = (),
        partition: str | None = None,
        tenant: str | None = None,
        limit: int = 1000,
        after_seq: int = 0,
    ) -> list[JobRow]:
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
        sql = f"SELECT * FROM jobs WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?"
        return [_job(r) for r in self._c.execute(sql, (*args, limit))]

    def attempts(self, job_id: str) -> list[AttemptRow]:
        rows = self._c.execute(
            "SELECT * FROM attempts WHERE job_id=? ORDER BY attempt", (job_id,)
        ).fetchall()
        return [_attempt(r) for r in rows]

    def attempt(self, job_id: str, attempt: int) -> AttemptRow | None:
        row = self._c.execute(
            "SELECT * FROM attempts WHERE job_id=? AND attempt=?", (job_id, attempt)
        ).fetchone()
        return _attempt(row) if row else None

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

    def usage(self) -> tuple[dict[str, float], float] | None:
        """The last saved fair-share usage per queue and when it was saved; None if never."""
        rows = self._c.execute("SELECT queue, usage, at FROM fair_share").fetchall()
        if not rows:
            return None
        return {r["queue"]: float(r["usage"]) for r in rows}, max(float(r["at"]) for r in rows)

    def counts(self) -> dict[str, int]:
        rows = self._c.execute("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state")
        return {r["state"]: r["n"] for r in rows}
