"""Job names: unique per tenant among jobs that have not ended, accepted wherever an id is.

A name may be reused once the job that had it has ended (as a Slurm user reuses a job name
every day); the tasks of one array share the array's name, and so do the replicas of one
serving deployment (serving jobs with the same name are one deployment: its p99 and SLO
attainment are measured together), so a name denotes one job, one array or one deployment.
A name never looks like an id (``j`` and digits), so ``j12`` is always the id. Lookups run on
a store connection (a reader for API threads, the inbox transaction for submits).
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpufence.control.base.arrays import parse_array
from gpufence.control.base.config import ADMIN
from gpufence.model.lifecycle import TERMINAL_STATES

Query = Callable[[str, Sequence[object]], sqlite3.Cursor]
JOB_ID = re.compile(r"j[0-9]+")
TASK_REF = re.compile(r"(j[0-9]+)_([0-9]+)")  # j4_3: task 3 of the array j4, as Slurm shows it
# str(s): a JobState's own repr is not an SQL string
_LIVE = f"state NOT IN ({','.join(repr(str(s)) for s in TERMINAL_STATES)})"


@dataclass(frozen=True, slots=True)
class Named:
    id: str
    tenant: str
    state: str
    array: str | None  # the id of the array the job is a task of
    index: int | None = None  # its index in that array


class UnknownJob(LookupError):
    """No job with this id or name (for this tenant)."""


def is_id(ref: str) -> bool:
    return JOB_ID.fullmatch(ref) is not None


def _looks_like_id(name: str) -> bool:
    """'J12', 'j١٢' (other digits): not an id, but read as one in a listing."""
    head, rest = name[:1], name[1:]
    return head in ("j", "J") and rest.isdigit()


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a job name (None: it can)."""
    if is_id(name) or _looks_like_id(name):
        return f"'{name}' looks like a job id (j and digits); pick a name that does not"
    if TASK_REF.fullmatch(name):
        return f"'{name}' looks like an array task (j4_3); pick a name that does not"
    if "," in name:
        return "a name cannot contain ',' (lists of names are comma-separated)"
    return None


def live_holder(q: Query, tenant: str, name: str, serving: bool = False) -> Named | None:
    """A job of ``tenant`` that has not ended and is called ``name`` (for a ``serving`` job:
    one that is not a serving replica, which would share the deployment's name)."""
    replicas = " AND workload_class != 'serving'" if serving else ""
    row = q(
        f"SELECT id, tenant, state, spec FROM jobs WHERE tenant=? AND name=? AND {_LIVE}"
        f"{replicas} ORDER BY seq LIMIT 1",
        (tenant, name),
    ).fetchone()
    return _named(row) if row is not None else None


def resolve(q: Query, tenant: str, ref: str) -> list[Named]:
    """The jobs ``ref`` (an id, or a name) denotes for ``tenant`` (the admin: any tenant's),
    in submission order. A name denotes the not-ended jobs with it, else the latest job with
    it (and, for an array, every task of that array). ``UnknownJob`` if none."""
    who = "" if tenant == ADMIN else " AND tenant=?"
    args: tuple[object, ...] = () if tenant == ADMIN else (tenant,)
    if is_id(ref):
        row = q(f"SELECT id, tenant, state, spec FROM jobs WHERE id=?{who}", (ref, *args))
        found = row.fetchone()
        tasks = array_of(q, ref, who, args) if found is None else []
        if found is None and not tasks:
            raise UnknownJob(f"no job {ref}")
        return tasks or [_named(found)]
    task = TASK_REF.fullmatch(ref)
    if task is not None:
        hit = [n for n in array_of(q, task[1], who, args) if n.index == int(task[2])]
        if not hit:
            raise UnknownJob(f"no task {task[2]} in an array {task[1]}")
        return hit
    sql = f"SELECT id, tenant, state, spec FROM jobs WHERE name=?{who} AND {_LIVE} ORDER BY seq"
    rows = [_named(r) for r in q(sql, (ref, *args)).fetchall()]
    if not rows:
        latest = q(
            f"SELECT id, tenant, state, spec FROM jobs WHERE name=?{who} ORDER BY seq DESC LIMIT 1",
            (ref, *args),
        ).fetchone()
        if latest is None:
            raise UnknownJob(f"no job named '{ref}'")
        last = _named(latest)
        if last.array is None:
            return [last]
        sql = f"SELECT id, tenant, state, spec FROM jobs WHERE name=?{who} ORDER BY seq"
        rows = [n for n in map(_named, q(sql, (ref, *args)).fetchall()) if n.array == last.array]
    return rows


def _named(row: sqlite3.Row | tuple[object, ...]) -> Named:
    spec = json.loads(str(row[3]))
    task = spec.get("array_task") if isinstance(spec, dict) else None
    if not isinstance(task, dict) or "job" not in task:
        return Named(str(row[0]), str(row[1]), str(row[2]), None)
    index = task.get("index")
    index = index if type(index) is int else None
    return Named(str(row[0]), str(row[1]), str(row[2]), str(task["job"]), index)


def array_of(q: Query, array: str, who: str = "", args: tuple[object, ...] = ()) -> list[Named]:
    """Every task of the array ``array`` (an id), in index order; none when it names no array.

    An array's id is taken from the job sequence right before its tasks, which are inserted
    one after the other in the same transaction: its tasks are the rows from the next ``seq``
    on, as many as its spec has indices (an array an older version stored is named by its
    first task's id: its tasks start at that ``seq``). Specs are read here, not by SQLite's
    JSON functions (a spec an older version stored with ``Infinity`` is malformed JSON to
    SQLite, which reports that as a damaged database). ``who``/``args``: the tenant filter."""
    seq = int(array[1:])
    cols = "SELECT seq, id, tenant, state, spec FROM jobs WHERE"
    head = q(f"{cols} seq IN (?, ?){who} ORDER BY seq", (seq, seq + 1, *args)).fetchall()
    first = next((r for r in head if _named(r[1:]).array == array), None)
    if first is None:
        return []
    spec = json.loads(str(first[4]))
    count = len(parse_array(str(spec.get("array", "")))[0]) if "array" in spec else 1
    rows = q(f"{cols} seq >= ?{who} ORDER BY seq LIMIT ?", (first[0], *args, count)).fetchall()
    return [n for n in (_named(r[1:]) for r in rows) if n.array == array]


def array_tasks(execute: Callable[..., sqlite3.Cursor], ref: str) -> tuple[str, ...]:
    """The ids of the tasks of the array ``ref`` (its id, or for an array an older version
    stored, its first task's) in order; none when it is no array: what a replayed submit (the
    same Idempotency-Key) answers with."""
    return tuple(n.id for n in array_of(execute, ref))


def pending_count(q: Query, tenant: str) -> int:
    """How many jobs of ``tenant`` are pending (held ones included): the count its cap on
    pending jobs is held to, read from migration 8's index of pending rows alone."""
    sql = "SELECT count(*) FROM jobs WHERE state = 'pending' AND tenant = ?"
    return int(q(sql, (tenant,)).fetchone()[0])


def idempotent(
    execute: Callable[..., sqlite3.Cursor], tenant: str, key: str
) -> tuple[str, str] | None:
    """(job id, request hash) an Idempotency-Key of ``tenant`` already stands for."""
    row = execute(
        "SELECT job_id, request FROM idempotency WHERE tenant=? AND key=?", (tenant, key)
    ).fetchone()
    return (str(row[0]), str(row[1])) if row else None


def claim_key(
    execute: Callable[..., sqlite3.Cursor], row: tuple[str, str, str, str, float]
) -> bool:
    """Insert (tenant, key, job id, request hash, at) unless the key stands for a job already:
    one statement for the usual new key."""
    cur = execute(
        "INSERT INTO idempotency(tenant, key, job_id, request, at) VALUES(?,?,?,?,?)"
        " ON CONFLICT(tenant, key) DO NOTHING",
        row,
    )
    return bool(cur.rowcount == 1)
