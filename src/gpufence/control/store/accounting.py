"""Accounting in the store: what each attempt held, each job's totals, and the two reads on them
(``gpufence history``, ``gpufence usage``).

What is recorded, and when (every write inside the reconciler's transaction of that change):

* at a bind, the attempt's ``gpus``: the GPU-equivalents it holds, as the scheduler charges its
  quota (``state.ledger.charge_milli`` / 1000): a whole GPU counts 1 (time-sliced too: it holds
  the GPU's quota), a fractional share its fraction (0.5), a MIG instance its compute slices out
  of the GPU's 7 (1g = 1/7 = 0.143, 3g = 0.429, 7g = 1), rounded to a thousandth as the quota is;
* at every attempt start and end (``account``), the job's totals from its attempts:
  ``first_started_at`` (its first bind), ``held_gpus`` (its latest attempt's), ``run_s`` and
  ``gpu_s`` (the sum over its ended attempts of bound -> stopped, times ``gpus`` for ``gpu_s``),
  ``attempts_run`` and ``preemptions`` (attempts the scheduler stopped to give their GPUs to
  other work: incident or on-demand preemption, reclaim of lent capacity or of an idle notebook).

A history page is then one indexed read of ``jobs`` (no attempt is read): an ended job's row is
JSON text a trigger keeps in ``jobs.history``; an open job's is made at read time, with the live
part of a running one (since its current attempt started). ``usage`` clips every attempt
to the window, so GPU-hours in a window are exact, not the totals of the jobs that touched it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any, Literal

from gpufence.telemetry.distribution import percentile
from gpufence.telemetry.incidents import PREEMPTION_REASONS, RECLAIM_REASONS

PREEMPTING = (*PREEMPTION_REASONS, *RECLAIM_REASONS)
"""Stop reasons counted in ``preemptions``."""
GROUPS = ("tenant", "partition", "class")
Group = Literal["tenant", "partition", "class"]
_GROUP_COLUMN = {"tenant": "tenant", "partition": "partition", "class": "workload_class"}
_ACTIVE = ("starting", "running", "stopping")

_REASONS = ", ".join(f"'{r}'" for r in PREEMPTING)
_TOTALS = f"""
UPDATE jobs SET (first_started_at, held_gpus, run_s, gpu_s, attempts_run, preemptions) = (
    SELECT MIN(started_at),
           (SELECT gpus FROM attempts b WHERE b.job_id = jobs.id ORDER BY b.attempt DESC LIMIT 1),
           COALESCE(SUM(MAX(0.0, ended_at - started_at)), 0.0),
           COALESCE(SUM(MAX(0.0, ended_at - started_at) * gpus), 0.0),
           COUNT(*),
           COUNT(CASE WHEN stop_reason IN ({_REASONS}) THEN 1 END)
    FROM attempts WHERE job_id = jobs.id
) WHERE id = ?
"""


def account(conn: sqlite3.Connection, job_id: str) -> None:
    """Recompute the job's totals from its attempts (a job has a few): the same call after the
    same change gives the same totals, so a transaction written again counts nothing twice."""
    conn.execute(_TOTALS, (job_id,))


_LIVE = (
    "(CASE WHEN state IN ('starting', 'running', 'stopping') AND started_at IS NOT NULL"
    " THEN MAX(0.0, :now - started_at) ELSE 0.0 END)"
)
"""The attempt running now, so far (``started_at``: the current attempt's start)."""
# an open job's row; an ended job's is kept in ``jobs.history`` by a trigger (migration 6),
# the same expression where the job runs no more (a test holds the two to the same shape)
_HISTORY_JSON = f"""json_object(
    'seq', seq, 'id', id, 'name', name, 'tenant', tenant, 'partition', partition,
    'class', workload_class, 'queue', queue, 'state', state, 'reason', reason,
    'exit_code', exit_code, 'submitted_at', submitted_at, 'started_at', first_started_at,
    'ended_at', ended_at, 'queue_delay_s', first_started_at - submitted_at,
    'elapsed_s', run_s + {_LIVE}, 'gpus', held_gpus, 'request', gpus,
    'gpu_hours', (gpu_s + {_LIVE} * COALESCE(held_gpus, 0.0)) / 3600.0,
    'attempts', attempts_run, 'preemptions', preemptions)"""


def history_json(
    conn: sqlite3.Connection,
    *,
    now: float,
    since: float | None = None,
    until: float | None = None,
    tenant: str | None = None,
    partition: str | None = None,
    states: Sequence[str] = (),
    after_seq: int = 0,
    limit: int = 1000,
) -> tuple[list[str], int | None]:
    """Jobs whose life (submitted -> ended, or now) overlaps ``[since, until)``, in submission
    order after ``after_seq``: each job as JSON text made by SQLite (``HistoryJob`` in the API;
    a page of 10,000 jobs is never built as Python objects), and the last one's ``seq``."""
    where = ["seq > :after"]
    args: dict[str, object] = {"after": after_seq, "now": now, "limit": limit}
    if until is not None:
        where.append("submitted_at < :until")
        args["until"] = until
    if since is not None:
        where.append("(ended_at IS NULL OR ended_at >= :since)")
        args["since"] = since
    if tenant is not None:
        where.append("tenant = :tenant")
        args["tenant"] = tenant
    if partition is not None:
        where.append("partition = :partition")
        args["partition"] = partition
    if states:
        marks = ", ".join(f":s{i}" for i in range(len(states)))
        where.append(f"state IN ({marks})")
        args.update({f"s{i}": v for i, v in enumerate(states)})
    sql = (
        f"SELECT seq, COALESCE(history, {_HISTORY_JSON}) FROM jobs"
        f" WHERE {' AND '.join(where)}"
        " ORDER BY seq LIMIT :limit"
    )
    rows = conn.execute(sql, args).fetchall()
    return [r[1] for r in rows], (rows[-1][0] if rows else None)


def history(conn: sqlite3.Connection, **query: Any) -> list[dict[str, Any]]:
    """``history_json`` parsed: one dict per job."""
    texts, _ = history_json(conn, **query)
    return [json.loads(t) for t in texts]


_TERMINAL = "('done', 'failed', 'cancelled', 'reclaimed', 'rejected')"
_OPEN = "('pending', 'starting', 'running', 'stopping')"


def usage(
    conn: sqlite3.Connection,
    *,
    by: Group,
    now: float,
    since: float,
    until: float | None = None,
    tenant: str | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per value of ``by`` over ``[since, until)`` (``until`` default ``now``), and in all:
    GPU-hours held in the window (each attempt clipped to it; a running one counts up to
    ``now``), the jobs that held GPUs in it, and the queue delay (submit -> first bind) of the
    ``started`` jobs first bound in it (p50, p95; null when none was).

    A job that ended and first started inside the window counts its recorded ``gpu_s`` (no
    attempt is read); only the others that overlap it (still open, or across one of its ends)
    have their attempts clipped. Every read is a range of the ``jobs_accounting`` index
    (``+state``: not the state index, which would scan every ended job)."""
    end = now if until is None else min(until, now)
    col = _GROUP_COLUMN[by]
    params: dict[str, object] = {"now": now, "end": end, "since": since, "tenant": tenant}
    only = "" if tenant is None else " AND tenant = :tenant"
    started_in = "first_started_at >= :since AND first_started_at < :end"
    delays: dict[str, list[float]] = {}
    sql = f"SELECT {col}, first_started_at - submitted_at FROM jobs WHERE {started_in}{only}"
    for key, d in conn.execute(sql, params):
        delays.setdefault(str(key), []).append(float(d))
    inside = f"""
        SELECT {col}, SUM(gpu_s), COUNT(*) FROM jobs
        WHERE {started_in} AND ended_at <= :end AND +state IN {_TERMINAL}{only}
        GROUP BY {col}"""
    edges = f"""
        WITH edge(id) AS (
            SELECT id FROM jobs
            WHERE state IN {_OPEN} AND first_started_at < :end{only}
            UNION ALL SELECT id FROM jobs
            WHERE first_started_at < :since AND ended_at > :since
                AND +state IN {_TERMINAL}{only}
            UNION ALL SELECT id FROM jobs
            WHERE {started_in} AND ended_at > :end AND +state IN {_TERMINAL}{only}
        )
        SELECT j.{col}, SUM(MAX(0.0,
                   MIN(COALESCE(a.ended_at,
                                CASE WHEN j.state IN {_OPEN} THEN :now ELSE a.started_at END),
                       :end) - MAX(a.started_at, :since)) * a.gpus),
               COUNT(DISTINCT a.job_id)
        FROM edge JOIN jobs j ON j.id = edge.id JOIN attempts a ON a.job_id = edge.id
        WHERE a.started_at < :end AND (a.ended_at IS NULL OR a.ended_at > :since)
        GROUP BY j.{col}"""
    held: dict[str, tuple[float, int]] = {}
    for sql in (inside, edges):
        for key, gpu_s, jobs in conn.execute(sql, params):
            had, n = held.get(str(key), (0.0, 0))
            held[str(key)] = (had + float(gpu_s or 0.0), n + int(jobs))
    keys = sorted(held.keys() | delays.keys())
    groups = [_group(k, *held.get(k, (0.0, 0)), delays.get(k, [])) for k in keys]
    every = [d for ds in delays.values() for d in ds]
    total = _group("", sum(g for g, _ in held.values()), sum(n for _, n in held.values()), every)
    del total["key"]
    return groups, total


def _group(key: str, gpu_s: float, jobs: int, delays: list[float]) -> dict[str, Any]:
    return {
        "key": key,
        "gpu_hours": gpu_s / 3600.0,
        "jobs": jobs,
        "started": len(delays),
        "queue_delay_p50_s": percentile(delays, 50) if delays else None,
        "queue_delay_p95_s": percentile(delays, 95) if delays else None,
    }
