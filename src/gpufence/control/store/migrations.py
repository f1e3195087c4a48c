"""The store's schema as numbered migrations, applied in order at open.

``meta.schema_version`` says which ran; a store newer than this code is refused rather than
misread. A migration is a list of statements run in one transaction with the version bump.
"""

from __future__ import annotations

import sqlite3

from gpufence.control.store.errors import StoreError

MIGRATIONS: tuple[str, ...] = (
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
    # 3: Idempotency-Key of POST /v1/jobs: the same key (per tenant) returns the same job
    """
    CREATE TABLE idempotency (
        tenant TEXT NOT NULL,
        key TEXT NOT NULL,
        job_id TEXT NOT NULL,
        request TEXT NOT NULL,            -- sha256 of the stored spec: a reuse must match
        at REAL NOT NULL,
        PRIMARY KEY (tenant, key)
    );
    """,
    # 4: list pages (state / tenant filter, in submission order) read an index range, not all
    # rows of the state sorted: 10,000 pending jobs page as fast as 10
    """
    CREATE INDEX jobs_state_seq ON jobs(state, seq);
    CREATE INDEX jobs_tenant_seq ON jobs(tenant, seq);
    """,
    # 5: name and GPU request in words as columns, so a list page needs no spec parsed
    """
    ALTER TABLE jobs ADD COLUMN name TEXT;
    ALTER TABLE jobs ADD COLUMN gpus TEXT;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def statements(script: str) -> list[str]:
    return [s for s in script.split(";") if s.strip()]


def schema_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    return int(row[0]) if row else 0


def migrate(conn: sqlite3.Connection, where: str) -> None:
    """Bring the store at ``conn`` (autocommit mode) to ``SCHEMA_VERSION``."""
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    version = schema_version(conn)
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{where} has schema version {version}, newer than this gpufence "
            f"({SCHEMA_VERSION}); upgrade gpufence or use another --data directory"
        )
    for n in range(version, SCHEMA_VERSION):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in statements(MIGRATIONS[n]):
                conn.execute(stmt)
            conn.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', ?)",
                (str(n + 1),),
            )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
