"""Crash recovery: rebuild the scheduler from the store and the processes that still run.

Before the store opens (``prepare_store``): a data directory whose store is *missing* while
processes of its jobs still run is refused (a new empty store would not know them and would run
other jobs on their GPUs); otherwise a new store's job ids continue after the highest job
directory, so no id is reused and no old log is overwritten.

For every job the store says is not finished:

* ``pending`` -> submitted again (same id, same submit time, same attempt number);
* ``starting`` / ``running`` / ``stopping`` -> the executor is asked to adopt the attempt from its
  directory (pid files guarded by process start time). Alive: the job is restored into the
  scheduler exactly where it runs (``JobRestored``), a pending stop is re-sent. Gone: the attempt
  ended while we were down; its exit (from the exit records, or "lost" when there are none)
  arrives through the normal exit path and is settled there as an *orphan*: done / failed by its
  code, or requeued as attempt + 1 while ``max_attempts`` allows. An attempt is never started
  twice: a lost attempt is replaced by the next one. The executor kills whatever is left of a
  member whose launcher died (its whole cgroup, setsid escapees included, then its process group;
  the cgroup is removed) and stops a gang that was only partly spawned, before it reports the
  attempt gone, so a requeued job never runs beside a survivor of its earlier attempt.
* a spec this version no longer accepts (stored by an older one, before input was validated):
  optional fields that fail (name, estimate, priority) are dropped with a warning; a job still
  invalid then is rejected (pending) or killed and failed (running) — never fed to the
  scheduler, which could not handle it.

Fair-share usage comes back as it was last saved (every 30 s and at a clean stop, see
``loop.USAGE_SAVE_S``), decayed to now; GPUs held while the plane was down are not charged.
Incident preemption and MIG defrag budgets come back exactly (saved with each notice,
``SchedulerQuery.preemption_windows`` and ``defrag_windows``): a crash loop does not refill
them.

Before any of this, a store older than its data directory is refused (``strangers``).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpufence.control.base.config import core_tenant
from gpufence.control.base.executor import Launch, Member
from gpufence.control.base.jobdirs import JOBS_DIR
from gpufence.control.base.jobspec import SubmitRequest, describe_errors
from gpufence.control.base.record_reads import prune_spool
from gpufence.control.containment.members import Containment
from gpufence.control.executors.leftovers import (
    recorded_ranks,
    settle_untracked_attempt,
)
from gpufence.control.gpus.devices import assignment_from_json
from gpufence.control.reconciler import Reconciler
from gpufence.control.reconciler.inbox import Live
from gpufence.control.reconciler.launches import job_dir, launch_for
from gpufence.control.recovery.live_scan import job_dirs, listed, live_attempts, member_cgroups
from gpufence.control.recovery.strangers import refuse_misplaced, refuse_strangers
from gpufence.control.store import database as st
from gpufence.control.store.errors import StoreError
from gpufence.control.store.reads import Reader
from gpufence.model.decisions import Reason
from gpufence.model.events import (
    DefragsRestored,
    Event,
    JobRestored,
    JobSubmitted,
    OutcomeKnown,
    PreemptionsRestored,
    UsageRestored,
)

log = logging.getLogger("gpufence.recovery")
DROPPABLE = ("name", "est_runtime_s", "priority", "max_attempts")
KILL_WAIT_S = 10.0


def prepare_store(data_dir: Path, containment: Containment | None = None) -> int:
    """Refuse a missing store whose jobs still run; return the id floor for a new store."""
    dirs = job_dirs(data_dir)
    floor = dirs[-1][0] if dirs else 0
    db = data_dir / st.DB_NAME
    missing = not db.exists() or db.stat().st_size == 0
    if missing and dirs:
        live = live_attempts(data_dir, containment)
        if live:
            raise StoreError(
                f"the store {db} is missing, but jobs of this data directory still run: "
                f"{listed(live)}. A new empty store would not know them and would put other jobs "
                "on their GPUs. Put the store file back (from a backup), or stop those processes "
                "(kill -- -PID) and start again."
            )
        log.warning(
            "the store %s is missing: starting a new, empty one; job ids continue after j%d so "
            "the logs in %s are kept",
            db,
            floor,
            data_dir / JOBS_DIR,
        )
    return floor


def damaged_hint(
    data_dir: Path, containment: Containment | None = None, skipped: bool = False
) -> str:
    """What to do about a damaged store. ``skipped``: --skip-integrity-check was given and
    start-up still failed (the damage is in what it must read): that is no way out."""
    live = live_attempts(data_dir, containment)
    salvage = f"`sqlite3 {data_dir / st.DB_NAME} .recover` salvages what is readable"
    if skipped:
        way = "the damage is in what start-up must read, so it cannot start on it as it is"
        if live:
            return (
                f"{way}; jobs of this data directory still run ({', '.join(live[:3])}): "
                f"restore the store from a backup ({salvage})"
            )
        return f"{way}: restore it from a backup, or move it away ({salvage})"
    if not live:
        return (
            "restore it from a backup, or move it away to start with an empty store; "
            "--skip-integrity-check starts on it as it is"
        )
    return (
        f"jobs of this data directory still run ({', '.join(live[:3])}): restore the store "
        "from a backup (moving it away would lose track of them), or --skip-integrity-check"
    )


def spec_of(row: st.JobRow) -> tuple[SubmitRequest | None, str]:
    """The stored spec as a request, repaired if an older version stored what is no longer
    accepted (why = "repaired": write it back); (None, why) if it cannot be."""
    raw: dict[str, Any] = dict(row.spec)
    dropped: list[str] = []
    for _ in range(len(DROPPABLE) + 1):
        try:
            req = SubmitRequest.model_validate(raw)
        except ValidationError as exc:
            bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
            fix = [f for f in DROPPABLE if f in bad and f in raw]
            if not fix:
                return None, describe_errors(exc)
            for f in fix:
                raw.pop(f)
                dropped.append(f)
            continue
        if dropped:
            log.warning("job %s: dropped invalid field(s) %s of its stored spec", row.id, dropped)
            return req, "repaired"
        return req, ""
    return None, "stored spec cannot be repaired"


def _with_dirs(data_dir: Path) -> frozenset[str]:
    try:
        return frozenset(os.listdir(data_dir / JOBS_DIR))
    except OSError:
        return frozenset()


def _past_untracked_attempts(
    data_dir: Path, row: st.JobRow, spec: SubmitRequest, containment: Containment | None
) -> tuple[int, str]:
    """A pending job whose attempt directory shows it was started: the store lost the Bind
    (its last writes, to a power cut or a failed disk). The attempt is settled from its
    records (one that still runs was refused before: ``strangers``; what is left of it is
    stopped): ``(attempt, "done")`` if every rank completed, else ``(next attempt, "lost")``;
    ``(attempt, "")`` when nothing was started."""
    attempt = row.attempt
    outcome = ""
    while True:
        adir = job_dir(data_dir, row.id) / f"attempt-{attempt}"
        if not recorded_ranks(adir):
            return attempt, outcome
        cgroups = member_cgroups(containment, row.id, attempt, adir, spec.replicas)
        codes = settle_untracked_attempt(adir, spec.replicas, cgroups)
        log.warning(
            "job %s attempt %d ran although the store lost its record (codes %s)",
            row.id,
            attempt,
            list(codes),
        )
        if codes and all(c == 0 for c in codes):
            return attempt, st.DONE
        attempt, outcome = attempt + 1, "lost"


def _record_untracked(
    tx: st.Tx, jid: str, attempt: int, outcome: str, ranks: int, now: float
) -> None:
    if outcome == st.DONE:
        msg = f"attempt {attempt} completed; the store had lost its record"
        tx.add_attempt(
            job_id=jid,
            attempt=attempt,
            pool="",
            lent_from=None,
            assignments=[],
            devices=[],
            started_at=now,
        )
        tx.set_attempt(jid, attempt, state="exited", ended_at=now, exit_codes=[0] * ranks)
        if tx.job(jid).state == st.PENDING:  # the Bind it lost: pending -> done is no move
            tx.set_job(jid, state=st.STARTING)
        tx.set_job(jid, state=st.DONE, attempt=attempt, exit_code=0, ended_at=now, message=msg)
    else:
        msg = f"an attempt the store had lost ended without completing; attempt {attempt} next"
        tx.set_job(jid, attempt=attempt, message=msg)
    tx.log(now, jid, "recovered", "recovery", msg)


def _launch(
    rec: Reconciler,
    row: st.JobRow,
    att: st.AttemptRow,
    nodes: list[str],
    spec: SubmitRequest | None,
) -> Launch:
    """The attempt's launch as a bind made it (``launch_for``); for a stored spec no longer
    valid (``spec`` None), enough of it to find and stop its processes."""
    members = tuple(
        Member(rank, nodes[int(a["node"])], tuple(devs))
        for rank, (a, devs) in enumerate(zip(att.assignments, att.devices, strict=True))
    )
    if spec is not None:
        return launch_for(rec.config, rec.data_dir, row.id, att.attempt, row.tenant, spec, members)
    raw = row.spec
    command = raw.get("command")
    cwd = raw.get("cwd")
    jdir = job_dir(rec.data_dir, row.id)
    return Launch(
        job_id=row.id,
        attempt=att.attempt,
        command=tuple(str(c) for c in command) if isinstance(command, list) else ("?",),
        env={str(k): str(v) for k, v in (raw.get("env") or {}).items()},
        members=members,
        attempt_dir=jdir / f"attempt-{att.attempt}",
        checkpoint_dir=jdir / "checkpoints",
        cwd=Path(cwd) if isinstance(cwd, str) and cwd else None,
        run_as=rec.config.run_as_for(row.tenant),
    )


def _kill_now(rec: Reconciler, launch: Launch) -> None:
    """Stop an adopted attempt at once and wait until its processes are gone."""
    rec.executor.stop(launch.job_id, launch.attempt, 0.0)
    key = (launch.job_id, launch.attempt)
    end = time.monotonic() + KILL_WAIT_S
    while key in rec.executor.running() and time.monotonic() < end:
        time.sleep(0.02)


def ended_parents(store: st.Store, parents: set[str], live: set[str]) -> list[Event]:
    """``OutcomeKnown`` of every dependency of a pending job that ended before this start (the
    scheduler knows only what is pending or running): a dependent then runs, or is cancelled,
    as it would have without the restart."""
    out: list[Event] = []
    with store.reader() as r:
        for pid in sorted(parents - live):
            row = r.job(pid)
            if row is not None and row.state in st.TERMINAL:
                out.append(OutcomeKnown(pid, row.state))
    return out


@dataclass
class _Findings:
    """What recovery found, row by row, before any of it is applied or written."""

    counts: dict[str, int] = field(
        default_factory=lambda: {"pending": 0, "adopted": 0, "ended-while-down": 0, "invalid": 0}
    )
    events: list[Event] = field(default_factory=list)
    stops: list[tuple[str, int]] = field(default_factory=list)
    invalid: list[tuple[str, str, str]] = field(default_factory=list)  # (job, ends in, why)
    repaired: list[tuple[str, SubmitRequest]] = field(default_factory=list)
    untracked: list[tuple[str, int, str, int]] = field(default_factory=list)
    """(job, attempt now, how its untracked attempt ended, ranks)"""
    parents: set[str] = field(default_factory=set)
    """Dependencies of pending jobs: the core must know how the ended ones ended."""
    dirs: frozenset[str] = frozenset()
    """The jobs that have a directory (listed once: a queued job has none to look into, and
    30,000 of them each looked for theirs took most of a restart)."""


def recover(
    rec: Reconciler, store: st.Store, containment: Containment | None = None
) -> dict[str, int]:
    """Runs before the reconciler thread starts; returns counts by outcome for the log.
    ``containment``: the local executor's, whose cgroups hold the processes of attempts the
    store lost (see ``_past_untracked_attempts``)."""
    # before anything is adopted: a store older than its data directory is refused
    refuse_strangers(store, rec.data_dir, containment)
    found = _Findings(dirs=_with_dirs(rec.data_dir))
    node_names = [n.name for n in rec.scheduler.cluster.nodes]
    with store.reader() as r:
        rows = r.jobs(states=(st.PENDING, *st.ACTIVE), limit=10**9)
        attempts = {row.id: r.attempt(row.id, row.attempt) for row in rows}
        found.events += _restored_state(r)
    refuse_misplaced(rec, rows, attempts, containment)  # before anything is adopted
    for row in rows:
        spec, why = spec_of(row)
        if spec is not None and why == "repaired":
            found.repaired.append((row.id, spec))
        att = attempts[row.id]
        if row.state == st.PENDING or att is None:
            _recover_pending(rec, row, spec, why, containment, found)
        else:
            _recover_active(
                rec, row, att, _launch(rec, row, att, node_names, spec), spec, why, found
            )
    found.events[:0] = ended_parents(store, found.parents, {row.id for row in rows})
    if found.invalid or found.repaired or found.untracked:
        _write_findings(store, found)
    rec.boot(found.events, found.stops)  # applied by the first cycle, before anything else
    prune_spool()
    counts = found.counts
    log.info(
        "recovered from the store: %d pending, %d still running (adopted), %d ended while "
        "down, %d invalid",
        counts["pending"],
        counts["adopted"],
        counts["ended-while-down"],
        counts["invalid"],
    )
    return counts


def _restored_state(r: Reader) -> list[Event]:
    """The core's state kept over restarts: fair-share history first, so the first cycle
    already ranks by it; then spent incident preemption and MIG defrag budgets, which stay
    spent."""
    out: list[Event] = []
    saved = r.usage()
    if saved is not None:
        usage, at = saved
        out.append(UsageRestored(tuple(sorted(usage.items())), at))
    budgets = r.preemptions()
    if budgets:
        out.append(PreemptionsRestored(tuple((p, tuple(t)) for p, t in sorted(budgets.items()))))
    defrags = r.defrags()
    if defrags:
        out.append(DefragsRestored(tuple((p, tuple(t)) for p, t in sorted(defrags.items()))))
    return out


def _recover_pending(
    rec: Reconciler,
    row: st.JobRow,
    spec: SubmitRequest | None,
    why: str,
    containment: Containment | None,
    found: _Findings,
) -> None:
    """A pending job (or one whose attempt the store lost): back into the core's queue, unless
    an attempt the store did not track already completed it."""
    if spec is None:
        found.invalid.append((row.id, st.REJECTED, why))
        return
    attempt, outcome = row.attempt, ""
    if row.id in found.dirs:
        attempt, outcome = _past_untracked_attempts(rec.data_dir, row, spec, containment)
    if outcome:
        found.untracked.append((row.id, attempt, outcome, spec.replicas))
        if outcome == st.DONE:
            found.events.append(OutcomeKnown(row.id, st.DONE))  # for its dependents
            return
    found.events.append(
        JobSubmitted(
            spec.to_job(row.id, row.submitted_at, core_tenant(row.tenant), row.held, row.held_by)
        )
    )
    found.parents.update(p for _kind, p in spec.dependencies())
    found.counts["pending"] += 1


def _recover_active(
    rec: Reconciler,
    row: st.JobRow,
    att: st.AttemptRow,
    launch: Launch,
    spec: SubmitRequest | None,
    why: str,
    found: _Findings,
) -> None:
    """A job whose attempt was starting, running or stopping: adopt its processes and restore
    it in the core as it was, or, where they are gone, let its exit settle it."""
    if spec is None:
        if rec.executor.adopt(launch):
            _kill_now(rec, launch)
        found.invalid.append((row.id, st.FAILED, why))
        return
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
        found.counts["ended-while-down"] += 1
        return
    found.counts["adopted"] += 1
    stop_reason = Reason(att.stop_reason) if att.stop_reason else None
    if row.cancel_requested:
        stop_reason = stop_reason or Reason.QUEUED
    found.events.append(
        JobRestored(
            job=spec.to_job(row.id, row.submitted_at, core_tenant(row.tenant)),
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
        found.stops.append((row.id, att.attempt))


def _write_findings(store: st.Store, found: _Findings) -> None:
    """Specs repaired, attempts the store had lost, jobs whose spec is no longer valid."""
    now = time.time()
    with store.transaction() as tx:
        for jid, spec in found.repaired:
            tx.set_spec(jid, spec.stored())
        for jid, attempt, outcome, ranks in found.untracked:
            _record_untracked(tx, jid, attempt, outcome, ranks, now)
        for jid, state, why in found.invalid:
            msg = f"its stored spec is not valid any more: {why}"
            tx.set_job(jid, state=state, reason="invalid", message=msg, ended_at=now)
            tx.log(now, jid, "invalid", "invalid", msg)
            log.error("job %s: %s; it ends %s", jid, msg, state)
    found.counts["invalid"] = len(found.invalid)
