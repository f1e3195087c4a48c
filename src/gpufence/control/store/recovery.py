"""Crash recovery: rebuild the scheduler from the store and the processes that still run.

For every job the store says is not finished:

* ``pending`` -> submitted again (same id, same submit time, same attempt number);
* ``starting`` / ``running`` / ``stopping`` -> the executor is asked to adopt the attempt from its
  directory (pid files guarded by process start time). Alive: the job is restored into the
  scheduler exactly where it runs (``JobRestored``), a pending stop is re-sent. Gone: the attempt
  ended while we were down; its exit (from the exit records, or "lost" when there are none)
  arrives through the normal exit path and is settled there as an *orphan*: done / failed by its
  code, or requeued as attempt + 1 while ``max_attempts`` allows. An attempt is never started
  twice: a lost attempt is replaced by the next one.

Fair-share usage comes back as it was last saved (every 30 s and at a clean stop, see
``reconciler.USAGE_SAVE_S``), decayed to now; GPUs held while the plane was down are not charged.
"""

from __future__ import annotations

import logging

from gpufence.control.executors.interface import Launch, Member
from gpufence.control.gpus.devices import assignment_from_json
from gpufence.control.inbox import Live
from gpufence.control.jobspec import from_stored
from gpufence.control.launches import launch_for
from gpufence.control.reconciler import Reconciler
from gpufence.control.store import database as st
from gpufence.model.decisions import Reason
from gpufence.model.events import Event, JobRestored, JobSubmitted, UsageRestored

log = logging.getLogger("gpufence.recovery")


def _launch(rec: Reconciler, row: st.JobRow, att: st.AttemptRow, nodes: list[str]) -> Launch:
    members = tuple(
        Member(rank, nodes[int(a["node"])], tuple(devs))
        for rank, (a, devs) in enumerate(zip(att.assignments, att.devices, strict=True))
    )
    spec = from_stored(row.spec)
    return launch_for(rec.config, rec.data_dir, row.id, att.attempt, row.tenant, spec, members)


def recover(rec: Reconciler) -> dict[str, int]:
    """Runs before the reconciler thread starts; returns counts by outcome for the log."""
    counts = {"pending": 0, "adopted": 0, "ended-while-down": 0}
    events: list[Event] = []
    stops: list[tuple[str, int]] = []
    node_names = [n.name for n in rec.scheduler.cluster.nodes]
    with rec.store.reader() as r:
        rows = r.jobs(states=(st.PENDING, *st.ACTIVE), limit=10**9)
        attempts = {row.id: r.attempt(row.id, row.attempt) for row in rows}
        saved = r.usage()
    if saved is not None:  # fair-share history first, so the first cycle already ranks by it
        usage, at = saved
        events.append(UsageRestored(tuple(sorted(usage.items())), at))
    for row in rows:
        spec = from_stored(row.spec)
        att = attempts[row.id]
        if row.state == st.PENDING or att is None:
            events.append(JobSubmitted(spec.to_job(row.id, row.submitted_at)))
            counts["pending"] += 1
            continue
        launch = _launch(rec, row, att, node_names)
        stopping = row.state == st.STOPPING
        live = Live(
            att.attempt,
            launch,
            row.tenant,
            row.partition,
            row.workload_class,
            spec,
            stopping=stopping and not row.cancel_requested,
            requeue=att.requeue,
            cancel=row.cancel_requested,
        )
        # registered before adopt(): a gone attempt reports its exit through the inbox at once
        rec.live[row.id] = live
        if not rec.executor.adopt(launch):
            live.orphan = True
            counts["ended-while-down"] += 1
            continue
        counts["adopted"] += 1
        stop_reason = Reason(att.stop_reason) if att.stop_reason else None
        if row.cancel_requested:
            stop_reason = stop_reason or Reason.QUEUED
        events.append(
            JobRestored(
                job=spec.to_job(row.id, row.submitted_at),
                pool=att.pool,
                assignments=tuple(assignment_from_json(a) for a in att.assignments),
                attempt=att.attempt,
                started_at=att.started_at,
                lent_from=att.lent_from,
                stopping=stop_reason if stopping else None,
                requeue=att.requeue,
            )
        )
        if stopping:
            stops.append((row.id, att.attempt))
    rec.boot(events, stops)  # applied by the first cycle, before anything else
    log.info(
        "recovered from the store: %d pending, %d still running (adopted), %d ended while down",
        counts["pending"],
        counts["adopted"],
        counts["ended-while-down"],
    )
    return counts
