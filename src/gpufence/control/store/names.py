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
# str(s): a JobState's own repr is not an SQL string
_LIVE = f"state NOT IN ({','.join(repr(str(s)) for s in TERMINAL_STATES)})"


@dataclass(frozen=True, slots=True)
class Named:
    id: str
    tenant: str
    state: str
    array: str | None  # the array (its first task's id) the job is a task of


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
        if found is None:
            raise UnknownJob(f"no job {ref}")
        return [_named(found)]
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
    array = str(task["job"]) if isinstance(task, dict) and "job" in task else None
    return Named(str(row[0]), str(row[1]), str(row[2]), array)


def array_tasks(
    execute: Callable[..., sqlite3.Cursor], first: str, seq: int, spec: dict[str, object]
) -> tuple[str, ...]:
    """Every task of the array ``first`` (at ``seq``, with ``spec``) names, in order (none when
    it is no array): what a replayed submit (the same Idempotency-Key) answers with. The tasks
    were inserted one after the other in one transaction, so they are the rows from ``first``
    on; their specs are read here, not by SQLite's JSON functions (a spec an older version
    stored with ``Infinity`` is malformed JSON to SQLite, which reports that as a damaged
    database)."""
    task, array = spec.get("array_task"), spec.get("array")
    if not isinstance(task, dict) or task.get("job") != first or not isinstance(array, str):
        return ()
    count = len(parse_array(array)[0])
    rows = execute(
        "SELECT id, spec FROM jobs WHERE seq >= ? ORDER BY seq LIMIT ?", (seq, count)
    ).fetchall()
    return tuple(
        str(jid) for jid, raw in rows if json.loads(raw).get("array_task", {}).get("job") == first
    )


def pending_count(q: Query, tenant: str) -> int:
    """How many jobs of ``tenant`` are pending (held ones included): the count its cap on
    pending jobs is held to, read from migration 8's index of pending rows alone."""
    sql = "SELECT count(*) FROM jobs WHERE state = 'pending' AND tenant = ?"
    return int(q(sql, (tenant,)).fetchone()[0])
