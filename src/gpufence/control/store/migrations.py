"""The store's schema as numbered migrations, applied in order at open.

``meta.schema_version`` says which ran; a store newer than this code is refused rather than
misread. A migration is a list of statements run in one transaction with the version bump.
"""

from __future__ import annotations

import sqlite3

from gpufence.control.store.errors import StoreError

# A job's totals from its attempts, as migration 6 first computed them (accounting.py keeps
# them current with the same expression: its own copy, as a migration must not change later).
# Preemptions: attempts the scheduler stopped to give their GPUs to other work (incident and
# on-demand preemption, reclaim of lent capacity or of an idle notebook).
_TOTALS_V6 = """
    (first_started_at, held_gpus, run_s, gpu_s, attempts_run, preemptions) = (
        SELECT MIN(started_at),
               (SELECT gpus FROM attempts b WHERE b.job_id = jobs.id
                ORDER BY b.attempt DESC LIMIT 1),
               COALESCE(SUM(MAX(0.0, ended_at - started_at)), 0.0),
               COALESCE(SUM(MAX(0.0, ended_at - started_at) * gpus), 0.0),
               COUNT(*),
               COUNT(CASE WHEN stop_reason IN ('incident-preemption', 'on-demand-preemption',
                                               'lent-reclaim', 'idle') THEN 1 END)
        FROM attempts WHERE job_id = jobs.id
    )
"""

# An ended job's ``gpufence history`` row as JSON, kept by a trigger at every write of the job
# once it has ended (it changes no more): a history page of ended jobs reads text, nothing is
# computed or encoded per job. accounting.HISTORY_JSON computes the same for open jobs.
_ENDED_V6 = "('done', 'failed', 'cancelled', 'reclaimed', 'rejected')"
_HISTORY_V6 = """json_object(
    'seq', seq, 'id', id, 'name', name, 'tenant', tenant, 'partition', partition,
    'class', workload_class, 'queue', queue, 'state', state, 'reason', reason,
    'exit_code', exit_code, 'submitted_at', submitted_at, 'started_at', first_started_at,
    'ended_at', ended_at, 'queue_delay_s', first_started_at - submitted_at,
    'elapsed_s', run_s, 'gpus', held_gpus, 'request', gpus, 'gpu_hours', gpu_s / 3600.0,
    'attempts', attempts_run, 'preemptions', preemptions)"""

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
    # 6: accounting (history, usage): the GPU-equivalents each attempt held and each job's
    # totals, kept current at every attempt start and end (accounting.py), so a history page
    # reads one row per job. Existing rows are filled from their attempts (MIG: compute slices
    # out of 7, as the quota charges it; the rest: GPUs x milli / 1000).
    f"""
    ALTER TABLE attempts ADD COLUMN gpus REAL NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN first_started_at REAL;
    ALTER TABLE jobs ADD COLUMN held_gpus REAL;
    ALTER TABLE jobs ADD COLUMN run_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN gpu_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN attempts_run INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN preemptions INTEGER NOT NULL DEFAULT 0;
    UPDATE attempts SET gpus = (
        SELECT COALESCE(SUM(
            json_array_length(json_extract(a.value, '$.gpus')) * CASE
                WHEN json_extract(a.value, '$.mig_profile') IS NOT NULL
                THEN ROUND(1000.0 * CAST(json_extract(a.value, '$.mig_profile') AS INTEGER) / 7)
                ELSE COALESCE(json_extract(a.value, '$.milli'), 1000)
            END) / 1000.0, 0)
        FROM json_each(attempts.assignments) AS a
    );
    UPDATE jobs SET {_TOTALS_V6} WHERE id IN (SELECT job_id FROM attempts);
    ALTER TABLE jobs ADD COLUMN history TEXT;
    CREATE TRIGGER jobs_history AFTER UPDATE ON jobs WHEN NEW.state IN {_ENDED_V6}
    BEGIN
        UPDATE jobs SET history = {_HISTORY_V6} WHERE seq = NEW.seq;
    END;
    UPDATE jobs SET state = state WHERE state IN {_ENDED_V6};
    CREATE INDEX jobs_ended ON jobs(ended_at, first_started_at, state);
    CREATE INDEX jobs_accounting ON jobs(first_started_at, ended_at, state, gpu_s,
        submitted_at, tenant, partition, workload_class)
    """,
    # 7: hold / release (a pending job's hold is state, not spec: it changes after submit), and
    # job names looked up per tenant (names stand in for ids; unique among jobs not ended)
    """
    ALTER TABLE jobs ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX jobs_tenant_name ON jobs(tenant, name);
    """,
    # 8: a tenant's pending jobs counted at each submit (its cap, issue 30 case 7) from an index
    # of pending rows only: the count reads that tenant's entries, never the table
    """
    CREATE INDEX jobs_pending_tenant ON jobs(tenant) WHERE state = 'pending';
    """,
    # accounts and QOS changed at run time by the admin (issue 32): tenants added or removed
    # over the cluster YAML's, API tokens (only their SHA-256 digests), queues' weight and
    # quota, and the audit trail of every such change (who, what, when, old -> new)
    """
    CREATE TABLE tenants (
        name TEXT PRIMARY KEY,
        removed INTEGER NOT NULL DEFAULT 0,  -- 1: removed (a YAML tenant too) until added again
        run_as TEXT,                         -- its jobs' Unix user (NULL: as the YAML's get one)
        allow_root INTEGER NOT NULL DEFAULT 0,
        at REAL NOT NULL
    );
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        digest TEXT NOT NULL UNIQUE,         -- sha256 hex of the secret; the secret is not kept
        created_at REAL NOT NULL,
        expires_at REAL,
        revoked_at REAL,
        replaced_by TEXT                     -- rotate: the token that took its place
    );
    CREATE INDEX tokens_tenant ON tokens(tenant);
    CREATE TABLE queue_settings (
        queue TEXT PRIMARY KEY,
        weight REAL,                         -- NULL: the YAML's
        quota_set INTEGER NOT NULL DEFAULT 0,  -- 1: nominal_milli overrides the YAML's
        nominal_milli INTEGER,               -- with quota_set, NULL means no quota
        at REAL NOT NULL
    );
    CREATE TABLE audit (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        t REAL NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        old TEXT NOT NULL DEFAULT '',
        new TEXT NOT NULL DEFAULT ''
    );
    """,
    # 10: drained nodes and maintenance windows (issue 32), the core's events at every start;
    # times are plane-clock readings (base/plane_clock.py), as every deadline in the store
    """
    CREATE TABLE node_drains (
        node TEXT PRIMARY KEY,
        reason TEXT NOT NULL,
        deadline REAL,                    -- running work stopped by then; NULL: it finishes
        at REAL NOT NULL,
        by TEXT NOT NULL
    );
    CREATE TABLE maintenance (
        id TEXT PRIMARY KEY,
        nodes TEXT NOT NULL,              -- node names, comma-separated
        start REAL NOT NULL,
        end REAL NOT NULL,
        reason TEXT NOT NULL,
        at REAL NOT NULL,
        by TEXT NOT NULL
    );
    """,
    # 11: who held a job (``gpufence hold``): its pending reason says "held by alice" after a
    # restart too, and a job the admin held is released by the admin only
    """
    ALTER TABLE jobs ADD COLUMN held_by TEXT NOT NULL DEFAULT '';
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def statements(script: str) -> list[str]:
    """The script's statements (a trigger's ``BEGIN ... END`` body, with its own semicolons,
    stays one statement)."""
    out: list[str] = []
    buf = ""
    for part in script.split(";"):
        buf += part + ";"
        if sqlite3.complete_statement(buf):
            if buf.strip(" \n;"):
                out.append(buf)
            buf = ""
    if buf.strip(" \n;"):
        out.append(buf)
    return out


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
