"""The reconciler: the control plane's only writer and the only caller of the scheduler.

One thread owns the ``Scheduler``. It sleeps on an inbox until something happens (a submission, a
cancel, a process exit, a checkpoint ack, a query) or a deadline falls due, then runs one cycle:

    1. inbox items -> persist what they mean (one transaction, fsynced when it acknowledges a
       submit or cancel: group commit for every request waiting) -> events
    2. events -> Scheduler.step -> decisions
    3. persist the decisions (one transaction) -> act on them (spawn, signal, stop)
       -> persist that the processes are running

Ordering is the crash-safety argument: a transition is committed before its side effect, so a
``kill -9`` between the two leaves a store that says "may be running" and recovery asks the
executor (see ``recovery.py``). API threads never touch the scheduler: they send an item (or a
read-only query, run here between cycles) and wait on its future.

Faults are a failure of one cycle, never of the loop, and lose no observation:

* the store refuses a write (disk full, read-only, I/O error): requests get ``StoreUnavailable``
  (HTTP 503 with the reason); exits, acks and node events are held in memory and written, in
  order, by the first cycle after the store takes writes again (retried every ``RETRY_S``);
  decisions the store refused are persisted before anything else and only then acted on;
* one inbox item the code cannot handle is undone alone (a savepoint) and logged with its job;
* the scheduler raises: the decisions it made before it raised are kept, the batch's events
  are applied again one at a time, and an event the scheduler still raises on is set aside with
  its job (logged, the job ended ``failed``, its processes killed), so the cluster goes on.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from gpufence.control.base import failpoints
from gpufence.control.base.config import ControlConfig
from gpufence.control.base.executor import AttemptExit, Executor, LaunchError
from gpufence.control.base.jobspec import SubmitRequest, escape
from gpufence.control.gpus.activity import job_activity
from gpufence.control.gpus.board import GpuBoard
from gpufence.control.gpus.devices import DeviceMap
from gpufence.control.gpus.mig_manager import MigManager, store_line
from gpufence.control.metrics import Telemetry
from gpufence.control.reconciler.context import WriteContext, submit_result
from gpufence.control.reconciler.decision_writes import (
    settle_stopped,
    write_decision,
    write_poisoned,
)
from gpufence.control.reconciler.group_commit import GroupCommit
from gpufence.control.reconciler.inbox import (
    Ack,
    Action,
    Call,
    Cancel,
    Clock,
    InvalidField,
    Item,
    Live,
    NodeEvent,
    Observation,
    Pending,
    PendingCapReached,
    Staged,
    Submit,
    SubmitResult,
    Unsaved,
    job_of,
    kind_of,
    reply,
    wrong_homes,
)
from gpufence.control.reconciler.item_writes import (
    stored_spec,
    write_cancel,
    write_observation,
    write_submit,
)
from gpufence.control.reconciler.job_writes import write_action
from gpufence.control.reconciler.launches import launch_failure
from gpufence.control.reconciler.seam import JobStore, JobTx
from gpufence.control.store import database as st
from gpufence.control.store.errors import IllegalStateChange, StoreUnavailable, medium_fault
from gpufence.control.store.reserve import SpaceLow
from gpufence.model.decisions import Decision, Reason
from gpufence.model.events import (
    Activity,
    Event,
    JobCancelled,
    JobRestored,
    JobStopped,
    JobSubmitted,
)
from gpufence.sched.jobs import JobState
from gpufence.sched.scheduler import Scheduler

log = logging.getLogger("gpufence.reconciler")

REFUSALS = (InvalidField, PendingCapReached, SpaceLow)
"""What a request is refused with on purpose (answered to its client, not logged as a bug)."""
USAGE_SAVE_S = 30.0  # fair-share usage is saved this often (and at a clean stop)
RETRY_S = 1.0  # while the store refuses writes, held observations are retried this often
GATHER_S = 0.002  # at most this long a request waits for others to share its commit
GATHER_MAX = 256  # a batch this large commits at once
T = TypeVar("T")


class Reconciler:
    def __init__(
        self,
        scheduler: Scheduler,
        config: ControlConfig,
        store: JobStore,
        executor: Executor,
        devices: DeviceMap,
        data_dir: Path,
        telemetry: Telemetry,
        clock: Clock | None = None,
        mig: MigManager | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.config = config
        self.store = store
        self.executor = executor
        self.devices = devices
        self.data_dir = data_dir
        self.telemetry = telemetry
        self.clock = clock or Clock()
        self.live: dict[str, Live] = {}
        self._inbox: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self.gather = GroupCommit(GATHER_S, GATHER_MAX)
        # carries out MigReconfigure (NVML on real GPUs, a timer on fake ones): mig_manager.py
        self.mig = mig if mig is not None else MigManager(scheduler.cluster, devices)
        self.mig.set_wake(lambda: self._inbox.put(Call(lambda _r: None, Future())))
        # what the GPU side knows beyond the ledger (MIG, MPS, foreign processes): for views
        self.gpu_board: GpuBoard | None = None
        self._next_activity = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.cycles = 0
        # NVML utilisation of whole GPUs (real GPUs only): idle detection looks at it too
        self.gpu_util: Callable[[int], float | None] | None = None
        self._boot: list[Event] = []
        self._usage_saved = -math.inf  # when fair-share usage was last saved
        self._boot_stops: list[tuple[str, int]] = []
        self._held: list[Observation] = []  # observed, not yet persisted
        self._unsaved: Unsaved | None = None  # decided, not yet persisted
        self._running_unsaved: list[tuple[str, int]] = []  # spawned, 'running' not persisted
        self._retry_at: float | None = None
        self.poisoned: dict[str, str] = {}  # every job set aside so far, and why
        # the home the core resolved for a kind of request (job_writes.predicted_home)
        self.homes_seen: dict[tuple[object, ...], tuple[str, str]] = {}
        # run on this thread after every cycle, on its settled ledger (dcgm job-mapping files)
        self.after_cycle: list[Callable[[Reconciler], None]] = []
        # all the write functions may touch (context.py): live and homes_seen are shared
        self.ctx = WriteContext(
            scheduler,
            config,
            data_dir,
            devices,
            telemetry,
            self.mig,
            self.live,
            self.homes_seen,
        )
        executor.set_callbacks(self._on_exit, self._on_ack)
        executor.set_node_callback(self._on_node)

    # ------------------------------------------------------------------ API (any thread)
    def submit(
        self, req: SubmitRequest, tenant: str, key: str | None = None
    ) -> Future[SubmitResult]:
        fut: Future[SubmitResult] = Future()
        self._inbox.put(Submit(req, tenant, fut, key, stored_spec(req)))
        self.gather.arrived(self._inbox.qsize)
        return fut

    def cancel(self, job_id: str) -> Future[str]:
        fut: Future[str] = Future()
        self._inbox.put(Cancel(job_id, fut))
        self.gather.arrived(self._inbox.qsize)
        return fut

    def action(
        self, job_id: str, kind: str, by: str = "", changes: dict[str, Any] | None = None
    ) -> Future[str]:
        """Hold, release or update a job (``job_writes.write_action``); ``by``: who asks."""
        fut: Future[str] = Future()
        self._inbox.put(Action(job_id, kind, fut, by, changes or {}))
        return fut

    def call(self, fn: Callable[[Reconciler], T]) -> Future[T]:
        """Run ``fn`` on the reconciler thread between cycles (read-only scheduler queries)."""
        fut: Future[T] = Future()
        self._inbox.put(Call(fn, fut))
        return fut

    def boot(self, events: list[Event], stops: list[tuple[str, int]]) -> None:
        """Recovery's findings, applied by the first cycle (restores before any placement)."""
        self._boot += events
        self._boot_stops += stops
        self._inbox.put(Call(lambda _r: None, Future()))

    def _on_exit(self, ev: AttemptExit) -> None:
        self.telemetry.exit_seen(ev.job_id, ev.attempt, time.time())
        self._inbox.put(ev)

    def _on_ack(self, job_id: str, attempt: int) -> None:
        self._inbox.put(Ack(job_id, attempt))

    def _on_node(self, node: str, up: bool) -> None:
        self._inbox.put(NodeEvent(node, up))

    @property
    def held(self) -> int:
        """Observations kept in memory because the store refused them (0 when healthy)."""
        return len(self._held)

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpufence-reconciler", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._save_usage_at_stop()

    def _save_usage_at_stop(self) -> None:
        """A clean stop keeps the fair-share history up to the last cycle; before the first
        cycle nothing is in memory yet, and the snapshot on disk is left as it is."""
        if self.cycles == 0:
            return
        try:
            with self.store.transaction() as tx:
                tx.save_usage(self.scheduler.fair_share_usage(), self.scheduler.now)
        except Exception as exc:
            log.error("could not save fair-share usage at shutdown: %s", exc)
        if self._held:
            log.error(
                "stopping with %d observation(s) not persisted (the store refused them); the "
                "next start settles those attempts from their exit records",
                len(self._held),
            )

    def _loop(self) -> None:
        while not self._stop.is_set():
            items = self._wait()
            if self._stop.is_set():
                break
            try:
                self.cycle(items)
            except Exception:  # a bug must not silently stop every job: log loudly, keep going
                log.exception("reconciler cycle failed")
                for it in items:
                    if isinstance(it, Submit | Cancel | Action | Call) and not it.future.done():
                        it.future.set_exception(RuntimeError("internal error; see server log"))

    def _timeout(self) -> float:
        now = self.clock()
        due = self.mig.next_due()
        times = [] if due is None else [due]
        wake = self.scheduler.next_wakeup()
        if wake is not None:
            times.append(wake)
        if self._watch_activity():
            times.append(self._next_activity)
        if self._retry_at is not None:
            times.append(self._retry_at)
        return max(0.0, min(times) - now) if times else 3600.0

    def _wait(self) -> list[Item]:
        try:
            first = self._inbox.get(timeout=self._timeout())
        except queue.Empty:
            return []
        items: list[Item] = [first]
        # group commit: a submit or cancel waits for its neighbours' (group_commit.py)
        if isinstance(first, Submit | Cancel):
            self.gather.wait(self._inbox.qsize)
        while len(items) < GATHER_MAX:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        if isinstance(first, Submit | Cancel):
            self.gather.taken(sum(isinstance(it, Submit | Cancel) for it in items))
        return items

    # ------------------------------------------------------------------ one cycle
    def cycle(self, items: Sequence[Item]) -> None:
        began = time.perf_counter()
        now = self.clock()
        self.cycles += 1
        calls = [it for it in items if isinstance(it, Call)]
        requests = [it for it in items if isinstance(it, Submit | Cancel | Action)]
        self._held += [it for it in items if isinstance(it, AttemptExit | Ack | NodeEvent)]
        try:
            if self._unsaved is not None:  # decided last time, the store refused it
                self._act(self._save(self._unsaved, now))
            staged = self._inbox_tx(requests, now)
        except StoreUnavailable as exc:
            self._retry_at = now + RETRY_S
            for r in requests:
                if not r.future.done():
                    r.future.set_exception(exc)
            self._answer(calls)
            return
        self._retry_at = None
        events = [*self._boot, *staged.events, *self._timed(now)]
        self._boot = []
        poisoned: dict[str, str] = {}
        decisions = self._step(events, now, poisoned)
        failpoints.hit("reconciler.after-step")
        stops, self._boot_stops = [*self._boot_stops, *staged.stops], []
        unsaved = Unsaved(events, decisions, staged.submits, stops, poisoned, staged.homes)
        act: Pending | None = None
        try:
            act = self._save(unsaved, now)
        except StoreUnavailable as exc:
            # the submits themselves are durable (phase 1): their answer goes out; the rest of
            # the cycle waits for the store, then is persisted before anything else
            self._unsaved = unsaved
            self._retry_at = now + RETRY_S
            log.error("decisions of this cycle wait for the store (%s)", exc.reason)
        for jid, fut in staged.submits:  # answered before spawning: spawns take milliseconds
            reply(fut, self.submit_result(jid))
        if act is not None:
            self._act(act)
        self.telemetry.cycle_done(time.perf_counter() - began)  # the read queries below: not
        for hook in self.after_cycle:
            hook(self)
        self._answer(calls)

    def _answer(self, calls: list[Call]) -> None:
        for c in calls:
            try:
                value = c.fn(self)
            except Exception as exc:  # the caller gets the error, the loop lives on
                value = exc
            reply(c.future, value)

    def _inbox_tx(self, requests: list[Submit | Cancel | Action], now: float) -> Staged:
        """Phase 1: persist every request and held observation in one transaction."""
        staged = Staged()
        held = list(self._held)
        marks = list(self._running_unsaved)
        if not (requests or held or marks):
            return staged
        durable = any(isinstance(r, Submit | Cancel | Action) for r in requests)
        with self.store.transaction(durable=durable) as tx:
            for jid, attempt in marks:
                self._mark_running(tx, jid, attempt)
            self._write_requests(tx, requests, now, staged)
            for ob in held:
                try:
                    with tx.savepoint():
                        write_observation(self.ctx, tx, ob, now, staged)
                except Exception as exc:
                    if medium_fault(exc):
                        raise
                    log.exception(
                        "%s of job %s could not be recorded; dropped",
                        kind_of(ob),
                        escape(getattr(ob, "job_id", "?")),
                    )
        # committed: memory follows the store
        self._held = self._held[len(held) :]
        self._running_unsaved = self._running_unsaved[len(marks) :]
        for effect in staged.effects:
            effect()
        for fut, value in staged.replies:
            reply(fut, value)
        if staged.exits:
            failpoints.hit("reconciler.after-exit-commit")
        if durable:
            failpoints.hit("reconciler.after-inbox-commit")
        return staged

    def _write_requests(
        self, tx: JobTx, requests: list[Submit | Cancel | Action], now: float, staged: Staged
    ) -> None:
        """Every request in one savepoint (the usual case: a batch of submits costs no more
        statements than its inserts); if one raises, the batch is undone and written again one
        request per savepoint, so that only the one that raised is refused."""
        if not requests:
            return
        mark = staged.mark()
        try:
            with tx.savepoint():
                for r in requests:
                    self._write_request(tx, r, now, staged)
            return
        except Exception as exc:
            if medium_fault(exc):
                raise  # the whole transaction is lost: held and retried
            staged.rewind(mark)
        for r in requests:
            try:
                with tx.savepoint():
                    self._write_request(tx, r, now, staged)
            except Exception as exc:
                if medium_fault(exc):
                    raise
                if not isinstance(exc, REFUSALS):  # a 4xx/507 for the client, not a bug
                    kind = type(r).__name__.lower()
                    what = "submit" if isinstance(r, Submit) else f"{kind} of job {r.job_id}"
                    log.exception("%s could not be handled; refused", what)
                staged.replies.append((r.future, exc))

    def _write_request(
        self, tx: JobTx, r: Submit | Cancel | Action, now: float, staged: Staged
    ) -> None:
        if isinstance(r, Submit):
            write_submit(self.ctx, tx, r, now, staged)
        elif isinstance(r, Action):
            write_action(self.ctx, tx, r, now, staged)
        else:
            write_cancel(self.ctx, tx, r, now, staged)

    def _step(self, events: list[Event], now: float, poisoned: dict[str, str]) -> list[Decision]:
        """Phase 2: ``Scheduler.step``, which must not take the loop down with it."""
        try:
            return self.scheduler.step(events, now)
        except Exception as exc:
            out = self._partial()
            log.error(
                "scheduling step failed (%s: %s); applying its %d event(s) one at a time",
                type(exc).__name__,
                escape(exc),
                len(events),
            )
        for ev in events:
            jid = job_of(ev)
            if isinstance(ev, JobSubmitted | JobRestored) and ev.job.id in self.scheduler.jobs():
                continue  # applied before the step raised
            try:
                out += self.scheduler.step([ev], now)
            except Exception as exc:
                out += self._partial()
                why = f"{type(ev).__name__}: {type(exc).__name__}: {exc}"
                log.exception(
                    "the scheduler raised on %s of job %s; set aside",
                    type(ev).__name__,
                    escape(jid),
                )
                if jid is not None:
                    poisoned[jid] = escape(why)
                    self.poisoned[jid] = escape(why)
                    out += self._evict(jid, now)
        return out

    def _partial(self) -> list[Decision]:
        """Decisions a step made before it raised (the ledger already reflects them)."""
        return self.scheduler.decisions_so_far()

    def _evict(self, jid: str, now: float) -> list[Decision]:
        """Take a poisoned job out of the scheduler, unless its processes still hold GPUs
        (then it leaves when they are gone, through its exit)."""
        core = self.scheduler.jobs().get(jid)
        if (
            core is None
            or jid in self.live
            or core.state
            not in (
                JobState.PENDING,
                JobState.RUNNING,
                JobState.STOPPING,
            )
        ):
            return []
        try:
            return self.scheduler.step([JobCancelled(jid)], now)
        except Exception:
            log.exception("could not take job %s out of the scheduler", escape(jid))
            return self._partial()

    def _save(self, u: Unsaved, now: float) -> Pending:
        """Phase 3: persist the decisions; returns what to do about them (``_act``). A step
        that leaves nothing to persist (submits queued behind busy GPUs: the usual step under
        load) opens no transaction."""
        act = Pending(stops=list(u.stops))
        homes = wrong_homes(self.scheduler.jobs(), u.homes)
        # a GPU refused or a failed re-partition, in the decision log
        lines = [line for ev in u.events if (line := store_line(ev)) is not None]
        usage_due = now - self._usage_saved >= USAGE_SAVE_S
        stopped = any(isinstance(ev, JobStopped) for ev in u.events)  # settle_stopped's
        if homes or lines or u.decisions or stopped or u.poisoned or usage_due:
            with self.store.transaction() as tx:
                tx.set_homes(homes)
                for kind, message in lines:
                    tx.log(now, None, kind, "", message)
                for d in u.decisions:
                    self._write_decision(tx, d, now, act)
                settle_stopped(self.ctx, tx, u.events, now)
                for jid, why in u.poisoned.items():
                    write_poisoned(self.ctx, tx, jid, why, now, act)
                if usage_due:
                    tx.save_usage(self.scheduler.fair_share_usage(), now)
                    self._usage_saved = now
        self._unsaved = None
        failpoints.hit("reconciler.after-decisions-commit")
        return act

    def _write_decision(self, tx: JobTx, d: Decision, now: float, act: Pending) -> None:
        """One decision in a savepoint of its own: a decision that would move a job against the
        lifecycle as the store has it (a Stop for a job whose exit the store already ended) is
        undone alone and logged; the cycle's other decisions stand."""
        try:
            with tx.savepoint():
                write_decision(self.ctx, tx, d, now, act)
        except IllegalStateChange as exc:
            job = getattr(d, "job_id", None)
            log.error("%s of job %s not applied: %s", type(d).__name__, escape(job), exc)
            tx.log(now, job, "not-applied", str(d.reason), f"{type(d).__name__}: {exc}")

    def _timed(self, now: float) -> list[Event]:
        out: list[Event] = []
        out += self.mig.ready(now)
        if self._watch_activity() and now >= self._next_activity:
            self._next_activity = now + self.config.activity_interval_s
            sample = self.executor.activity()
            for (jid, attempt), util in sample.items():
                live = self.live.get(jid)
                if live is not None and live.attempt == attempt and self._reclaimable(live):
                    devices = [d for m in live.launch.members for d in m.devices]
                    out.append(Activity(jid, job_activity(util, devices, self.gpu_util)))
        return out

    def _reclaimable(self, live: Live) -> bool:
        part = self.scheduler.cluster.partitions.get(live.partition)
        return part is not None and part.reclaim is not None

    def _watch_activity(self) -> bool:
        return any(self._reclaimable(v) and not v.stopping for v in self.live.values())

    # ------------------------------------------------------------------ side effects
    def _mark_running(self, tx: JobTx, jid: str, attempt: int) -> None:
        tx.set_attempt(jid, attempt, state=st.RUNNING)
        live = self.live.get(jid)
        if live is not None and live.attempt == attempt and not live.stopping and not live.cancel:
            tx.set_job(jid, state=st.RUNNING)

    def _act(self, act: Pending) -> None:
        started: list[tuple[str, int]] = []
        for jid, launch in act.launches:
            if not launch.members:  # a failed bind: report the exit so the core frees the GPUs
                self._inbox.put(AttemptExit(jid, launch.attempt, False, (), False))
                continue
            try:
                self.executor.start(launch)
                started.append((jid, launch.attempt))
                self.telemetry.started(launch, time.time())
            except LaunchError as exc:
                self._launch_failed(jid, launch.attempt, exc)
        if started:
            failpoints.hit("reconciler.after-spawn")
            try:
                with self.store.transaction() as tx:
                    for jid, attempt in started:
                        self._mark_running(tx, jid, attempt)
            except StoreUnavailable:  # 'starting' is as safe as 'running' for recovery
                self._running_unsaved += started
                self._retry_at = self.clock() + RETRY_S
        for jid, attempt, reason, deadline in act.notices:
            self.executor.notice(jid, attempt, reason, deadline, reason != Reason.IDLE)
        for jid, attempt in act.stops:
            self.executor.stop(jid, attempt, self.config.stop_grace_s)
        for jid, attempt in act.kills:
            self.executor.stop(jid, attempt, 0.0)

    def _launch_failed(self, jid: str, attempt: int, exc: LaunchError) -> None:
        """A start that failed for lack of descriptors, processes or memory is reported lost
        (requeued while ``max_attempts`` allows); any other failure fails the attempt."""
        why, text, codes = launch_failure(exc)
        log.error("job %s attempt %d could not start: %s", jid, attempt, escape(exc))
        try:
            with self.store.transaction() as tx:
                tx.set_job(jid, message=text)
                tx.log(self.clock(), jid, "launch-failed", why, f"attempt {attempt}: {exc}")
        except StoreUnavailable:
            pass  # the exit below still ends it; only the message is lost
        self._inbox.put(AttemptExit(jid, attempt, False, codes, False))

    def submit_result(self, jid: str) -> SubmitResult:
        return submit_result(self.scheduler, self.live, jid, self.store.job)
