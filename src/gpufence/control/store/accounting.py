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

A history page is then one indexed read of ``jobs`` (no attempt is read); a running job's live
part (since its current attempt started) is added at read time. ``usage`` clips every attempt
to the window, so GPU-hours in a window are exact, not the totals of the jobs that touched it.
"""

from __future__ import annotations

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


_HISTORY_COLUMNS = (
    "seq, id, name, tenant, partition, workload_class, queue, state, reason, exit_code,"
    " submitted_at, first_started_at, started_at, ended_at, run_s, gpu_s, held_gpus,"
    " attempts_run, preemptions, gpus"
)


def history(
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
) -> list[dict[str, Any]]:
    """Jobs whose life (submitted -> ended, or now) overlaps ``[since, until)``, in submission
    order after ``after_seq``: one JSON-ready dict per job (``HistoryJob`` in the API)."""
    where = ["seq > ?"]
    args: list[object] = [after_seq]
    if until is not None:
        where.append("submitted_at < ?")
        args.append(until)
    if since is not None:
        where.append("(ended_at IS NULL OR ended_at >= ?)")
        args.append(since)
    if tenant is not None:
        where.append("tenant = ?")
        args.append(tenant)
    if partition is not None:
        where.append("partition = ?")
        args.append(partition)
    if states:
        where.append(f"state IN ({','.join('?' * len(states))})")
        args += list(states)
    sql = f"SELECT {_HISTORY_COLUMNS} FROM jobs WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?"
    return [_history_row(r, now) for r in conn.execute(sql, (*args, limit))]


def _history_row(r: Sequence[Any], now: float) -> dict[str, Any]:
    (seq, jid, name, tenant, partition, wclass, queue, state, reason, exit_code, submitted,
     first, current, ended, run_s, gpu_s, held, attempts, preemptions, request) = r  # fmt: skip
    run, gpu = float(run_s), float(gpu_s)
    if state in _ACTIVE and current is not None:  # the attempt running now, so far
        live = max(0.0, now - float(current))
        run += live
        gpu += live * float(held or 0.0)
    return {
        "seq": seq,
        "id": jid,
        "name": name,
        "tenant": tenant,
        "partition": partition,
        "class": wclass,
        "queue": queue,
        "state": state,
        "reason": reason,
        "exit_code": exit_code,
        "submitted_at": submitted,
        "started_at": first,
        "ended_at": ended,
        "queue_delay_s": (float(first) - float(submitted)) if first is not None else None,
        "elapsed_s": run,
        "gpus": held,
        "request": request,
        "gpu_hours": gpu / 3600.0,
        "attempts": attempts,
        "preemptions": preemptions,
    }


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
    ``started`` jobs first bound in it (p50, p95; null when none was)."""
    end = now if until is None else min(until, now)
    col = _GROUP_COLUMN[by]
    params: dict[str, object] = {"now": now, "end": end, "since": since, "tenant": tenant}
    only = "" if tenant is None else " AND j.tenant = :tenant"
    held_sql = f"""
        SELECT j.{col}, SUM(MAX(0.0, MIN(COALESCE(a.ended_at, j.ended_at, :now), :end)
                                   - MAX(a.started_at, :since)) * a.gpus),
               COUNT(DISTINCT a.job_id)
        FROM attempts a JOIN jobs j ON j.id = a.job_id
        WHERE a.started_at < :end AND (a.ended_at IS NULL OR a.ended_at > :since){only}
        GROUP BY j.{col}
    """
    delay_sql = f"""
        SELECT j.{col}, j.first_started_at - j.submitted_at FROM jobs j
        WHERE j.first_started_at >= :since AND j.first_started_at < :end{only}
    """
    delays: dict[str, list[float]] = {}
    for key, d in conn.execute(delay_sql, params):
        delays.setdefault(str(key), []).append(float(d))
    held: dict[str, tuple[float, int]] = {}
    for key, gpu_s, jobs in conn.execute(held_sql, params):
        held[str(key)] = (float(gpu_s or 0.0), int(jobs))
    groups = [
        _group(key, *held.get(key, (0.0, 0)), delays.get(key, []))
        for key in sorted(held.keys() | delays.keys())
    ]
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
