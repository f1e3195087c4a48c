"""Durable control-plane state: one SQLite file (WAL) in the data directory.

The reconciler is the only writer. It persists every transition *before* acting on it (a Bind is
written as ``starting`` before any process is spawned, a Stop as ``stopping`` before the signal),
so a ``kill -9`` at any moment leaves a store from which a restart can tell, for every job,
whether its processes may exist. API handlers read through their own connections
(``reads.Reader``); WAL lets them read while the reconciler writes.

Durability: a transaction that acknowledges something to a client (``durable=True``: a submit's
201, a cancel) commits with ``synchronous=FULL``: the WAL is fsynced before the reply, so the
acknowledgement survives an OS crash or power loss. The reconciler's own bookkeeping (binds,
state changes, the event log) commits with ``synchronous=NORMAL``: it survives a process crash;
a power loss may drop the last of it, which a restart recovers (the processes died with the
power; the launchers' exit records are fsynced). WAL frames are appended in order, so a durable
commit also makes everything before it durable. The reconciler commits all the submits waiting
in its inbox in one transaction (group commit): one fsync per batch, not per job.

Job ids come from the store's own sequence (``jobs.seq``, AUTOINCREMENT), advanced in the same
transaction as the insert: a rolled-back submit consumes nothing, and an id is never reused.
Every change of a job's state is handed, once its transaction has committed, to the store's
``observers`` (``StateChange``): telemetry counts outcomes and time in state from them without
the reconciler reporting each transition itself. A change of state must be a move of the job
lifecycle (``model/lifecycle.py``): ``Tx.set_job`` raises ``IllegalStateChange`` otherwise.

Open = lock (``ownership.py``), integrity check (``PRAGMA quick_check``, bounded in time),
migrations (``migrations.py``), owner row. Errors of the medium (disk full, read-only, I/O) are
``StoreUnavailable`` with the reason (``errors.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpufence.control.base import failpoints
from gpufence.control.base.privatefs import PRIVATE_DIR
from gpufence.control.store import accounting, migrations, names
from gpufence.control.store.errors import (
    IllegalStateChange,
    StoreError,
    StoreUnavailable,
    integrity_problem,
    unavailable,
)
from gpufence.control.store.ownership import FileLock, Owner
from gpufence.control.store.reads import Reader
from gpufence.control.store.reserve import SpaceReserve
from gpufence.control.store.rows import (
    AttemptRow,
    JobRow,
    Observer,
    StateChange,
    select_job,
)
from gpufence.model import lifecycle
from gpufence.model.lifecycle import JobState

log = logging.getLogger("gpufence.store")
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


SCHEMA_VERSION = migrations.SCHEMA_VERSION
INTEGRITY_BUDGET_S = 30.0
"""At most this long for ``PRAGMA quick_check`` at start (a store of a few GB); then it goes on
with a warning rather than keep the cluster down."""

__all__ = [
    "AttemptRow",
    "IllegalStateChange",
    "JobRow",
    "Observer",
    "Reader",
    "StateChange",
    "StoreError",
    "StoreUnavailable",
]


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")  # per transaction: see Store.transaction
    conn.execute("PRAGMA foreign_keys=ON")
    # the journals of savepoints and statements (a batch of submits is one savepoint) in
    # memory, not a temporary file created, written and deleted per transaction: they only
    # serve a rollback inside the transaction (the WAL, fsynced, is what survives a crash)
    conn.execute("PRAGMA temp_store=MEMORY")
    return conn


def _refined(gone: StoreUnavailable, db: Path) -> StoreUnavailable:
    """SQLite reports a read-only file system as an I/O error or "cannot open": say so."""
    if gone.reason in ("I/O error", "cannot open the database file") and _read_only(db.parent):
        return StoreUnavailable("read-only")
    return gone


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _text_or_none(value: object) -> str | None:
    """A string SQLite can store as text (no lone surrogates), else None."""
    if not isinstance(value, str):
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


_CANONICAL = json.JSONEncoder(sort_keys=True)  # json.dumps(sort_keys=True), built once


def spec_text(spec: dict[str, Any]) -> str:
    """A spec as the store keeps it: canonical JSON (sorted keys)."""
    return _CANONICAL.encode(spec)


def request_hash(spec: dict[str, Any], text: str | None = None) -> str:
    """What an Idempotency-Key is bound to: the stored spec, canonical JSON, sha256 (``text``:
    that JSON, when the caller has it already)."""
    return hashlib.sha256((text or spec_text(spec)).encode()).hexdigest()


class Store:
    """The reconciler's writable handle; ``reader()`` gives API threads their own.

    ``Store(data_dir)`` locks the database file (``StoreError`` if another control plane has
    it), checks its integrity unless ``check_integrity=False`` (``--skip-integrity-check``),
    migrates it and claims the owner row. ``id_floor``: job ids continue after it (a new store
    in a data directory that already has job directories must not reuse their ids).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        check_integrity: bool = True,
        id_floor: int = 0,
        integrity_budget_s: float = INTEGRITY_BUDGET_S,
        reserve_bytes: int = 0,
    ) -> None:
        data_dir.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        self.path = data_dir / DB_NAME
        existed = self.path.exists() and self.path.stat().st_size > 0
        # FileLock creates the file 0600 before SQLite opens it: SQLite gives its -wal and -shm
        # files the mode of the database file, so none of the store is ever readable by others
        self._file_lock = FileLock(self.path)
        self.owner = Owner.me()
        self._owner_text = self.owner.to_json()
        try:
            self._conn = _connect(self.path)
            if existed and check_integrity:
                problem = integrity_problem(self._conn, integrity_budget_s)
                if problem is not None:
                    raise StoreError(f"the store {self.path} is damaged: {problem}")
            migrations.migrate(self._conn, str(self.path))
            self._claim(id_floor)
            self.reserve = SpaceReserve(self._conn, data_dir, reserve_bytes)
            self.reserve.top_up()
        except sqlite3.DatabaseError as exc:
            self._abort()
            gone = unavailable(exc)
            if gone is not None and gone.reason != "database damaged":
                raise _refined(gone, self.path) from None
            raise StoreError(f"the store {self.path} is damaged or not a store: {exc}") from None
        except BaseException:
            self._abort()
            raise
        self._lock = threading.Lock()
        self.observers: list[Observer] = []
        self._durable = True  # the connection's synchronous setting (FULL)
        self._broken: StoreUnavailable | None = None

    def _abort(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:
            conn.close()
        self._file_lock.release()

    def _claim(self, id_floor: int) -> None:
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            row = c.execute("SELECT value FROM meta WHERE key='owner'").fetchone()
            prev = Owner.from_json(row["value"]) if row else None
            if prev is not None and not prev.same_process(self.owner) and prev.alive():
                raise StoreError(
                    f"the store {self.path} belongs to a control plane that still runs "
                    f"({prev.describe()}); stop it first (the file was copied or replaced?)"
                )
            c.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES('owner', ?)",
                (self._owner_text,),
            )
            if id_floor > self._last_seq():
                c.execute("DELETE FROM sqlite_sequence WHERE name='jobs'")
                c.execute("INSERT INTO sqlite_sequence(name, seq) VALUES('jobs', ?)", (id_floor,))
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def _last_seq(self) -> int:
        row = self._conn.execute("SELECT seq FROM sqlite_sequence WHERE name='jobs'").fetchone()
        return int(row[0]) if row else 0

    def _check_owner(self) -> None:
        """Still ours? (File not deleted/replaced, owner row not taken over.)"""
        if not self._file_lock.still_at_path():
            raise StoreUnavailable(
                f"the database file {self.path} was deleted or replaced while in use; "
                "restart the control plane"
            )
        row = self._conn.execute("SELECT value FROM meta WHERE key='owner'").fetchone()
        if row is not None and row["value"] == self._owner_text:
            return  # the row _claim wrote (the usual case: no JSON to parse each transaction)
        owner = Owner.from_json(row["value"]) if row else None
        if owner is None or not owner.same_process(self.owner):
            raise StoreUnavailable("another control plane took over this store")

    # ------------------------------------------------------------------ schema
    def schema_version(self) -> int:
        return migrations.schema_version(self._conn)

    @contextmanager
    def transaction(self, durable: bool = False) -> Iterator[Tx]:
        """One atomic write; everything in it lands or nothing does. ``durable``: fsynced
        before this returns (it acknowledges something to a client). A fault of the medium
        raises ``StoreUnavailable`` (nothing of the transaction landed)."""
        with self._lock:
            c = self._conn
            try:
                if durable != self._durable:
                    c.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
                    self._durable = durable
                c.execute("BEGIN IMMEDIATE")
                self._check_owner()
            except sqlite3.Error as exc:
                self._rollback()
                raise self._unavailable(exc) from exc
            except StoreUnavailable:
                self._rollback()
                raise
            tx = Tx(c, self.reserve)
            try:
                yield tx
                failpoints.hit("store.before-commit")
                c.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                gone = unavailable(exc)
                if gone is None:
                    raise  # a bug (constraint, SQL): not the medium's fault
                raise self._note(gone) from exc
            except BaseException:
                self._rollback()
                raise
            if self._broken is not None:
                # the operator saw the ERROR line; say as plainly when it is over
                log.warning("store takes writes again (it was %s)", self._broken)
                self._broken = None
        failpoints.hit("store.after-commit")
        for observe in self.observers if tx.changes else ():
            try:
                observe(tx.changes)
            except Exception:  # telemetry must never fail a committed transition
                log.exception("a store observer failed")

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error as exc:  # the medium is gone; SQLite rolls back at next use
                log.warning("rollback failed: %s", exc)

    def _unavailable(self, exc: sqlite3.Error) -> Exception:
        gone = unavailable(exc)
        return self._note(gone) if gone is not None else exc

    def _note(self, gone: StoreUnavailable) -> StoreUnavailable:
        gone = _refined(gone, self.path)
        if self._broken is None or self._broken.reason != gone.reason:
            log.error("%s", gone)
        self._broken = gone
        return gone

    @property
    def broken(self) -> StoreUnavailable | None:
        """Why the last write failed, until one succeeds again."""
        return self._broken

    def problem(self) -> str | None:
        """Why the store takes no writes now (None: it does): the last write's failure, or its
        file gone from its path (deleted, or the data directory moved) though nothing was
        written since -- what readiness reports, without waiting for a write to fail."""
        if self._broken is not None:
            return str(self._broken)
        if not self._file_lock.still_at_path():
            return (
                f"store unavailable: the database file {self.path} was deleted or moved while "
                "in use; restart the control plane on the data directory where it is now"
            )
        return None

    def job(self, job_id: str) -> JobRow | None:
        """Read through the writer's connection (the reconciler's own reads)."""
        with self._lock:
            return select_job(self._conn, job_id)

    def keep_reserve(self, now: float) -> None:
        """Refill the free-space reserve if it is short (``reserve.py``; rate-limited)."""
        with self._lock:
            self.reserve.top_up(now)

    def max_seq(self) -> int:
        with self._lock:
            row = self._conn.execute("SELECT MAX(seq) AS m FROM jobs").fetchone()
        return int(row["m"] or 0)

    def reader(self) -> Reader:
        return Reader(self.path)

    def close(self) -> None:
        self._conn.close()
        self._file_lock.release()  # after the connection: see ownership.FileLock


class Tx:
    """Writes inside one transaction (only the reconciler holds one)."""

    def __init__(self, conn: sqlite3.Connection, reserve: SpaceReserve | None = None) -> None:
        self._c = conn
        self.reserve = reserve
        self.changes: list[StateChange] = []  # for the observers, once committed
        self._seq: int | None = None  # the jobs sequence as this transaction advanced it

    def execute(self, sql: str, args: Sequence[object] = ()) -> sqlite3.Cursor:
        return self._c.execute(sql, args)

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A part of the transaction that can fail alone (one inbox item)."""
        self._c.execute("SAVEPOINT item")
        noted = len(self.changes)
        seq = self._seq
        try:
            yield
        except BaseException:
            del self.changes[noted:]  # what was rolled back never happened
            self._c.execute("ROLLBACK TO item")
            self._c.execute("RELEASE item")
            self._seq = seq  # ids taken inside were rolled back with it
            raise
        self._c.execute("RELEASE item")

    def job(self, job_id: str) -> JobRow:
        row = select_job(self._c, job_id)
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

    def save_preemptions(self, times: Mapping[str, Sequence[float]]) -> None:
        """Replace the saved incident-preemption budget windows (partition -> when each
        counted preemption was made) with these."""
        self._save_windows("preemptions", times)

    def save_defrags(self, times: Mapping[str, Sequence[float]]) -> None:
        """The same for the MIG defrag windows (MIG pool -> when each defrag stop was noticed)."""
        self._save_windows("mig-defrags", times)

    def _save_windows(self, key: str, times: Mapping[str, Sequence[float]]) -> None:
        self._c.execute(
            "INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)",
            (key, json.dumps({p: list(t) for p, t in times.items()}, sort_keys=True)),
        )

    def add_job(
        self,
        *,
        tenant: str,
        spec: dict[str, Any],
        workload_class: str,
        partition: str,
        queue: str,
        submitted_at: float,
        job_id: str | None = None,
        gpus: str | None = None,
        text: str | None = None,
    ) -> str:
        """Insert a pending job; its id is ``j<seq>`` from the store's sequence, taken in this
        transaction (read once per transaction: the insert advances it, nothing else writes
        it meanwhile). ``job_id`` only for tests that need a given name; ``text``: the spec's
        ``spec_text`` if the caller has it."""
        seq = self._last_seq() + 1
        jid = job_id or f"j{seq}"
        name = spec.get("name")
        self._c.execute(
            "INSERT INTO jobs(seq, id, tenant, spec, workload_class, partition, queue, state,"
            " submitted_at, name, gpus) VALUES(?,?,?,?,?,?,?,?,?,?,?)",
            (
                seq,
                jid,
                tenant,
                text if text is not None else spec_text(spec),
                workload_class,
                partition,
                queue,
                PENDING,
                submitted_at,
                _text_or_none(name),
                gpus,
            ),
        )
        self.changes.append(
            StateChange(jid, None, PENDING, partition, workload_class, queue, submitted_at, None)
        )
        self._seq = seq
        return jid

    def _last_seq(self) -> int:
        if self._seq is None:
            row = self._c.execute("SELECT seq FROM sqlite_sequence WHERE name='jobs'").fetchone()
            self._seq = int(row[0]) if row else 0
        return self._seq

    def next_id(self, reserve: bool = False) -> str:
        """The id ``add_job`` gives the next job; ``reserve``: no job gets it (an array's)."""
        seq = self._last_seq() + 1
        if reserve:
            self._seq = seq
        return f"j{seq}"

    def submit_refusal(self) -> str | None:
        """Why no new job may be stored now (the disk is full: ``reserve.py``), or None."""
        return self.reserve.submit_refusal() if self.reserve is not None else None

    def pending_count(self, tenant: str) -> int:
        return names.pending_count(self._c.execute, tenant)

    def live_holder(self, tenant: str, name: str, serving: bool = False) -> names.Named | None:
        """The job of ``tenant`` that has not ended and is called ``name`` (``names.py``)."""
        return names.live_holder(self._c.execute, tenant, name, serving)

    def resolve_ref(self, tenant: str, ref: str) -> list[names.Named]:
        """The jobs an id or a name denotes for ``tenant`` (``names.resolve``)."""
        return names.resolve(self._c.execute, tenant, ref)

    def array_tasks(self, ref: str) -> tuple[str, ...]:
        """Every task of the array ``ref`` names, in order (``names.array_tasks``)."""
        return names.array_tasks(self._c.execute, ref)

    def idempotent(self, tenant: str, key: str) -> tuple[str, str] | None:
        """(job id, request hash) an Idempotency-Key of this tenant already stands for."""
        return names.idempotent(self._c.execute, tenant, key)

    def claim_key(self, tenant: str, key: str, job_id: str, request: str, at: float) -> bool:
        """Bind an Idempotency-Key of this tenant to ``job_id``, unless it stands for a job
        already (False: ``idempotent`` says which)."""
        return names.claim_key(self._c.execute, (tenant, key, job_id, request, at))

    def set_spec(self, job_id: str, spec: dict[str, Any]) -> None:
        """Replace a stored spec (recovery's repair of one an older version accepted)."""
        name = spec.get("name")
        self._c.execute(
            "UPDATE jobs SET spec=?, name=? WHERE id=?",
            (json.dumps(spec, sort_keys=True), _text_or_none(name), job_id),
        )

    def set_homes(self, homes: Sequence[tuple[str, str, str | None]]) -> None:
        """(job id, partition, queue) of each job: where the scheduler put them (one statement
        for a batch of submits)."""
        self._c.executemany(
            "UPDATE jobs SET partition=?, queue=? WHERE id=?", [(p, q, j) for j, p, q in homes]
        )

    def set_job(self, job_id: str, **fields: object) -> None:
        """Update a job's columns; a new ``state`` must be a move of the lifecycle table
        (``IllegalStateChange`` otherwise, before anything is written)."""
        if not fields:
            return
        if "state" in fields:
            self._move(job_id, fields)
        cols = ", ".join(f"{k}=?" for k in fields)
        self._c.execute(f"UPDATE jobs SET {cols} WHERE id=?", (*fields.values(), job_id))

    def _move(self, job_id: str, fields: dict[str, object]) -> None:
        """Hold a state write to the lifecycle table and note it for the observers: the one
        primary-key read the change note needed anyway gives the state it moves from."""
        row = self._c.execute(
            "SELECT state, partition, workload_class, queue, submitted_at, started_at"
            " FROM jobs WHERE id=?",
            (job_id,),
        ).fetchone()
        if row is None:
            return  # no such job: the UPDATE changes nothing
        if row["state"] == fields["state"]:
            # not a move, and allowed: a cancel of a job already being stopped (a preemption in
            # its grace), or a Stop or a set-aside of one being cancelled, writes ``stopping``
            # again with its own reason; nothing changed state, so no observer hears of it
            return
        if not lifecycle.legal_names(row["state"], fields["state"]):
            raise IllegalStateChange(job_id, str(row["state"]), str(fields["state"]))
        started = fields.get("started_at", row["started_at"])
        self.changes.append(
            StateChange(
                job_id,
                row["state"],
                str(fields["state"]),
                str(fields.get("partition", row["partition"])),
                row["workload_class"],
                str(fields.get("queue", row["queue"])),
                float(row["submitted_at"]),
                float(started) if isinstance(started, int | float) else None,
            )
        )

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
        gpus: float = 0.0,
    ) -> None:
        """``gpus``: the GPU-equivalents it holds (accounting.py says how they count)."""
        self._c.execute(
            "INSERT OR REPLACE INTO attempts(job_id, attempt, state, pool, lent_from,"
            " assignments, devices, started_at, gpus) VALUES(?,?,?,?,?,?,?,?,?)",
            (
                job_id,
                attempt,
                STARTING,
                pool,
                lent_from,
                json.dumps(assignments),
                json.dumps(devices),
                started_at,
                gpus,
            ),
        )
        accounting.account(self._c, job_id)

    def set_attempt(self, job_id: str, attempt: int, **fields: object) -> None:
        if "exit_codes" in fields:
            fields["exit_codes"] = json.dumps(fields["exit_codes"])
        cols = ", ".join(f"{k}=?" for k in fields)
        self._c.execute(
            f"UPDATE attempts SET {cols} WHERE job_id=? AND attempt=?",
            (*fields.values(), job_id, attempt),
        )
        if "ended_at" in fields or "stop_reason" in fields or "started_at" in fields:
            accounting.account(self._c, job_id)

    def log(self, t: float, job_id: str | None, kind: str, reason: str, message: str) -> None:
        self._c.execute(
            "INSERT INTO events(t, job_id, kind, reason, message) VALUES(?,?,?,?,?)",
            (t, job_id, kind, reason, message),
        )
