"""The reconciler: the control plane's only writer and the only caller of the scheduler.

One thread owns the ``Scheduler``. It sleeps on an inbox until something happens (a submission, a
cancel, a process exit, a checkpoint ack, a query) or a deadline falls due, then runs one cycle:

    inbox items -> persist what they mean -> events -> Scheduler.step -> persist the decisions
    -> act on them (spawn, signal, stop) -> persist that the processes are running

Ordering is the crash-safety argument: a transition is committed before its side effect, so a
``kill -9`` between the two leaves a store that says "may be running" and recovery asks the
executor (see ``recovery.py``). API threads never touch the scheduler: they send an item (or a
read-only query, run here between cycles) and wait on its future.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

from gpufence.control.config import ControlConfig
from gpufence.control.executors.interface import AttemptExit, Executor, Launch, LaunchError, Member
from gpufence.control.gpus.activity import job_activity
from gpufence.control.gpus.devices import DeviceError, DeviceMap, assignment_json
from gpufence.control.inbox import (
    Ack,
    Call,
    Cancel,
    CancelError,
    Clock,
    Item,
    Live,
    NodeEvent,
    Pending,
    Submit,
    SubmitResult,
)
from gpufence.control.jobspec import SubmitRequest, from_stored
from gpufence.control.metrics import Telemetry
from gpufence.control.store import database as st
from gpufence.model.decisions import (
    Bind,
    Decision,
    MigReconfigure,
    Notice,
    NoticeWithdrawn,
    Reason,
    Reject,
    Requeue,
    Stop,
)
from gpufence.model.events import (
    Activity,
    CheckpointAck,
    Event,
    JobCancelled,
    JobFinished,
    JobStopped,
    JobSubmitted,
    MigReconfigured,
    NodeDown,
    NodeUp,
)
from gpufence.sched.jobs import JobState
from gpufence.sched.scheduler import Scheduler

log = logging.getLogger("gpufence.reconciler")
USAGE_SAVE_S = 30.0  # fair-share usage is saved this often (and at a clean stop)
T = TypeVar("T")


class Reconciler:
    def __init__(
        self,
        scheduler: Scheduler,
        config: ControlConfig,
        store: st.Store,
        executor: Executor,
        devices: DeviceMap,
        data_dir: Path,
        telemetry: Telemetry,
        clock: Clock | None = None,
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
        self._mig_ready: dict[int, float] = {}
        self._next_activity = 0.0
        self._next_id = 1
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.cycles = 0
        # NVML utilisation of whole GPUs (real GPUs only): idle detection looks at it too
        self.gpu_util: Callable[[int], float | None] | None = None
        self._boot: list[Event] = []
        self._usage_saved = -math.inf  # when fair-share usage was last saved
        self._boot_stops: list[tuple[str, int]] = []
        executor.set_callbacks(self._on_exit, self._on_ack)
        executor.set_node_callback(self._on_node)

    # ------------------------------------------------------------------ API (any thread)
    def submit(self, req: SubmitRequest, tenant: str) -> Future[SubmitResult]:
        fut: Future[SubmitResult] = Future()
        self._inbox.put(Submit(req, tenant, fut))
        return fut

    def cancel(self, job_id: str) -> Future[str]:
        fut: Future[str] = Future()
        self._inbox.put(Cancel(job_id, fut))
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

    # ------------------------------------------------------------------ thread
    def start(self, first_id: int) -> None:
        self._next_id = first_id
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
        except Exception:
            log.exception("could not save fair-share usage at shutdown")

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
                    if isinstance(it, Submit | Cancel | Call) and not it.future.done():
                        it.future.set_exception(RuntimeError("internal error; see server log"))

    def _timeout(self) -> float:
        now = self.clock()
        times = [t for t in self._mig_ready.values()]
        wake = self.scheduler.next_wakeup()
        if wake is not None:
            times.append(wake)
        if self._watch_activity():
            times.append(self._next_activity)
        return max(0.0, min(times) - now) if times else 3600.0

    def _wait(self) -> list[Item]:
        try:
            first = self._inbox.get(timeout=self._timeout())
        except queue.Empty:
            return []
        items: list[Item] = [first]
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                return items

    # ------------------------------------------------------------------ one cycle
    def cycle(self, items: list[Item]) -> None:
        now = self.clock()
        self.cycles += 1
        events, self._boot = self._boot, []
        submits: list[tuple[str, Future[SubmitResult]]] = []
        calls: list[Call] = []
        act = Pending(stops=self._boot_stops)
        self._boot_stops = []
        with self.store.transaction() as tx:
            for it in items:
                if isinstance(it, Submit):
                    self._submit(tx, it, now, events, submits)
                elif isinstance(it, Cancel):
                    self._cancel(tx, it, now, events, act)
                elif isinstance(it, AttemptExit):
                    self._exited(tx, it, now, events)
                elif isinstance(it, Ack):
                    live = self.live.get(it.job_id)
                    if live is not None and live.attempt == it.attempt and not live.orphan:
                        tx.log(now, it.job_id, "checkpoint-ack", "", f"attempt {it.attempt}")
                        events.append(CheckpointAck(it.job_id))
                elif isinstance(it, NodeEvent):  # the core stops (and requeues) what ran there
                    tx.log(now, None, "node-up" if it.up else "node-down", "", it.node)
                    events.append(NodeUp(it.node) if it.up else NodeDown(it.node))
                elif isinstance(it, Call):
                    calls.append(it)
            events += self._timed(now)
        decisions = self.scheduler.step(events, now)
        with self.store.transaction() as tx:
            for jid, _fut in submits:  # the partition and queue the scheduler resolved
                rec = self.scheduler.jobs().get(jid)
                if rec is not None and rec.home:
                    tx.set_job(jid, partition=rec.home, queue=rec.queue)
            for d in decisions:
                self._decided(tx, d, now, act)
            self._settle_stopped(tx, events, now)
            if now - self._usage_saved >= USAGE_SAVE_S:
                tx.save_usage(self.scheduler.fair_share_usage(), now)
                self._usage_saved = now
        self._act(act, now)
        for jid, fut in submits:
            fut.set_result(self._submit_result(jid))
        for c in calls:
            try:
                c.future.set_result(c.fn(self))
            except Exception as exc:  # the caller gets the error, the loop lives on
                c.future.set_exception(exc)

    def _timed(self, now: float) -> list[Event]:
        out: list[Event] = []
        for gpu, t in list(self._mig_ready.items()):
            if t <= now:
                del self._mig_ready[gpu]
                out.append(MigReconfigured(gpu))
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

    # ------------------------------------------------------------------ inbox items
    def _submit(
        self,
        tx: st.Tx,
        it: Submit,
        now: float,
        events: list[Event],
        submits: list[tuple[str, Future[SubmitResult]]],
    ) -> None:
        jid = f"j{self._next_id}"
        self._next_id += 1
        req = it.req
        tx.add_job(
            job_id=jid,
            tenant=it.tenant,
            spec=req.stored(),
            workload_class=str(req.workload_class),
            partition=req.partition,
            queue=req.queue,
            submitted_at=now,
        )
        tx.log(now, jid, "submitted", "", f"by {it.tenant}: {req.request().describe()}")
        events.append(JobSubmitted(req.to_job(jid, now)))
        submits.append((jid, it.future))
        self.telemetry.submitted(str(req.workload_class))

    def _cancel(self, tx: st.Tx, it: Cancel, now: float, events: list[Event], act: Pending) -> None:
        rec = self.scheduler.jobs().get(it.job_id)
        live = self.live.get(it.job_id)
        if live is not None:
            if live.cancel:
                it.future.set_result(st.STOPPING)
                return
            live.cancel = True
            tx.set_job(it.job_id, cancel_requested=1, state=st.STOPPING, reason="cancelled")
            tx.log(now, it.job_id, "cancel", "", "stopping its processes")
            act.stops.append((it.job_id, live.attempt))
            it.future.set_result(st.STOPPING)
        elif rec is not None and rec.state is JobState.PENDING:
            events.append(JobCancelled(it.job_id))
            tx.set_job(
                it.job_id, cancel_requested=1, state=st.CANCELLED, reason="cancelled", ended_at=now
            )
            tx.log(now, it.job_id, "cancel", "", "removed from its queue")
            it.future.set_result(st.CANCELLED)
        else:
            it.future.set_exception(CancelError(f"job {it.job_id} has already ended"))

    def _exited(self, tx: st.Tx, ev: AttemptExit, now: float, events: list[Event]) -> None:
        live = self.live.get(ev.job_id)
        if live is None or live.attempt != ev.attempt:
            return  # a stale report (an earlier attempt, or a job already settled)
        jid = ev.job_id
        code = _exit_code(ev.codes)
        tx.set_attempt(jid, ev.attempt, state="exited", ended_at=now, exit_codes=list(ev.codes))
        msg = f"attempt {ev.attempt} exited with {list(ev.codes)}"
        tx.log(now, jid, "exited", "", msg)
        self.telemetry.released(live.launch)
        del self.live[jid]
        if live.orphan:
            self._settle_orphan(tx, live, jid, ev, now, events)
            return
        if live.cancel:
            events.append(JobCancelled(jid))
            tx.set_job(jid, state=st.CANCELLED, ended_at=now, exit_code=code)
        elif live.stopping:
            events.append(JobStopped(jid))  # the core requeues it or ends it (reclaimed/failed)
            tx.set_job(jid, exit_code=code)
        else:
            events.append(JobFinished(jid, ev.succeeded))
            if ev.succeeded:
                tx.set_job(jid, state=st.DONE, ended_at=now, exit_code=code, reason="", message="")
            elif ev.codes:
                tx.set_job(
                    jid,
                    state=st.FAILED,
                    ended_at=now,
                    exit_code=code,
                    reason="exit-code",
                    message=msg,
                )
            else:  # never started (launch or device error): keep the message that says why
                tx.set_job(jid, state=st.FAILED, ended_at=now)

    def _settle_orphan(
        self, tx: st.Tx, live: Live, jid: str, ev: AttemptExit, now: float, events: list[Event]
    ) -> None:
        """An attempt that ended while the control plane was down (see recovery.py)."""
        lost = any(c is None for c in ev.codes)
        code = _exit_code(ev.codes)
        if live.cancel:
            tx.set_job(jid, state=st.CANCELLED, ended_at=now, exit_code=code)
        elif (lost or (live.stopping and live.requeue)) and live.attempt < live.spec.max_attempts:
            why = "lost while the control plane was down" if lost else "stopped for requeue"
            tx.set_job(jid, state=st.PENDING, attempt=live.attempt + 1, started_at=None)
            tx.log(now, jid, "requeued", "recovery", f"attempt {live.attempt} {why}")
            events.append(JobSubmitted(live.spec.to_job(jid, now)))
        elif lost:
            why = f"attempt {live.attempt} lost and max_attempts ({live.spec.max_attempts}) used"
            tx.set_job(jid, state=st.FAILED, ended_at=now, reason="lost", message=why)
        elif live.stopping:
            tx.set_job(jid, state=st.FAILED, ended_at=now, exit_code=code)
        else:
            state = st.DONE if ev.succeeded else st.FAILED
            tx.set_job(jid, state=state, ended_at=now, exit_code=code)

    def _settle_stopped(self, tx: st.Tx, events: list[Event], now: float) -> None:
        """A stop without requeue ends the job in the core without a decision: persist how."""
        for ev in events:
            if not isinstance(ev, JobStopped):
                continue
            rec = self.scheduler.jobs().get(ev.job_id)
            if rec is None or rec.state is JobState.PENDING:
                continue
            # reclaimed or failed, as the core's lifecycle table says a stop ends (after_stop)
            tx.set_job(ev.job_id, state=rec.state, ended_at=now)

    # ------------------------------------------------------------------ decisions
    def _decided(self, tx: st.Tx, d: Decision, now: float, act: Pending) -> None:
        if isinstance(d, Bind):
            self._bind(tx, d, now, act)
        elif isinstance(d, Notice):
            live = self.live.get(d.job_id)
            tx.log(now, d.job_id, "notice", str(d.reason), d.message)
            tx.set_job(d.job_id, reason=str(d.reason), message=f"notice: {d.message}")
            if live is not None:
                act.notices.append((d.job_id, live.attempt, str(d.reason), d.deadline))
        elif isinstance(d, NoticeWithdrawn):
            tx.log(now, d.job_id, "notice-withdrawn", str(d.reason), d.message)
            tx.set_job(d.job_id, reason="", message="")
        elif isinstance(d, Stop):
            live = self.live.get(d.job_id)
            tx.log(now, d.job_id, "stop", str(d.reason), d.message)
            tx.set_job(d.job_id, state=st.STOPPING, reason=str(d.reason), message=d.message)
            if live is not None:
                live.stopping, live.requeue = True, d.requeue
                tx.set_attempt(d.job_id, live.attempt, stop_reason=str(d.reason), requeue=d.requeue)
                act.stops.append((d.job_id, live.attempt))
            self.telemetry.stopped(str(d.reason), d.requeue)
        elif isinstance(d, Requeue):
            row = tx.job(d.job_id)
            row_attempt = row.attempt
            tx.set_job(
                d.job_id,
                state=st.PENDING,
                attempt=row_attempt + 1,
                started_at=None,
                reason=str(d.reason),
                message=f"requeued: {d.message}",
            )
            tx.log(now, d.job_id, "requeue", str(d.reason), f"attempt {row_attempt + 1} next")
        elif isinstance(d, Reject):
            tx.set_job(
                d.job_id, state=st.REJECTED, reason=str(d.reason), message=d.message, ended_at=now
            )
            tx.log(now, d.job_id, "reject", str(d.reason), d.message)
            self.telemetry.rejected(str(d.reason))
        elif isinstance(d, MigReconfigure):
            tx.log(now, None, "mig-reconfigure", str(d.reason), f"GPU {d.gpu}: {d.layout}")
            # fake GPUs re-partition instantly; the delay models nvidia-smi's
            self._mig_ready[d.gpu] = now + d.ready_after_s

    def _bind(self, tx: st.Tx, d: Bind, now: float, act: Pending) -> None:
        row = tx.job(d.job_id)
        rec = self.scheduler.job(d.job_id)
        spec = from_stored(row.spec)
        nodes = self.scheduler.cluster.nodes
        members = []
        try:
            for rank, a in enumerate(d.assignments):
                members.append(Member(rank, nodes[a.node].name, self.devices.devices(a)))
        except DeviceError as exc:
            # cannot be run as placed (real MIG layout drifted): fail it loudly; the empty
            # launch reports an exit next cycle, which frees the GPUs in the core
            tx.set_job(d.job_id, reason="device", message=str(exc))
            empty = _failed_launch(d.job_id, row.attempt, self.data_dir)
            self.live[d.job_id] = Live(
                row.attempt, empty, row.tenant, rec.home, row.workload_class, spec
            )
            act.launches.append((d.job_id, empty))
            return
        attempt = row.attempt
        launch = Launch(
            job_id=d.job_id,
            attempt=attempt,
            command=tuple(spec.command),
            # NVML (discovery) numbers GPUs in PCI bus order; make CUDA agree
            env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID", **spec.env},
            members=tuple(members),
            attempt_dir=self.data_dir / "jobs" / d.job_id / f"attempt-{attempt}",
            checkpoint_dir=self.data_dir / "jobs" / d.job_id / "checkpoints",
            cwd=Path(spec.cwd) if spec.cwd else None,
        )
        tx.add_attempt(
            job_id=d.job_id,
            attempt=attempt,
            pool=d.partition,
            lent_from=d.lent_from,
            assignments=[assignment_json(a) for a in d.assignments],
            devices=[list(m.devices) for m in members],
            started_at=now,
        )
        tx.set_job(
            d.job_id,
            state=st.STARTING,
            started_at=now,
            partition=rec.home,
            queue=rec.queue,
            reason=str(d.reason),
            message=d.message,
        )
        tx.log(now, d.job_id, "bind", str(d.reason), _where(d, members))
        self.live[d.job_id] = Live(attempt, launch, row.tenant, rec.home, row.workload_class, spec)
        act.launches.append((d.job_id, launch))
        self.telemetry.bound(rec.home, row.workload_class, now - row.submitted_at)

    # ------------------------------------------------------------------ side effects
    def _act(self, act: Pending, now: float) -> None:
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
                log.error("job %s attempt %d could not start: %s", jid, launch.attempt, exc)
                with self.store.transaction() as tx:
                    tx.set_job(jid, message=f"launch failed: {exc}")
                self._inbox.put(AttemptExit(jid, launch.attempt, False, (), False))
        if started:
            with self.store.transaction() as tx:
                for jid, attempt in started:
                    tx.set_attempt(jid, attempt, state=st.RUNNING)
                    live = self.live.get(jid)
                    if live is not None and not live.stopping and not live.cancel:
                        tx.set_job(jid, state=st.RUNNING)
        for jid, attempt, reason, deadline in act.notices:
            self.executor.notice(jid, attempt, reason, deadline, reason != Reason.IDLE)
        for jid, attempt in act.stops:
            self.executor.stop(jid, attempt, self.config.stop_grace_s)

    def _submit_result(self, jid: str) -> SubmitResult:
        rec = self.scheduler.jobs().get(jid)
        if rec is None:
            return SubmitResult(jid, st.PENDING)
        if rec.state is JobState.REJECTED:
            row = self.store.job(jid)
            reason, message = (row.reason, row.message) if row else ("", "")
            return SubmitResult(jid, st.REJECTED, reason, message)
        if rec.state is JobState.PENDING:
            why = self.scheduler.why_pending(jid)
            return SubmitResult(
                jid, st.PENDING, str(why.reason) if why else "", why.message if why else ""
            )
        return SubmitResult(jid, st.RUNNING if jid in self.live else str(rec.state))


def _exit_code(codes: tuple[int | None, ...]) -> int | None:
    known = [c for c in codes if c is not None]
    bad = [c for c in known if c != 0]
    return bad[0] if bad else (0 if known and len(known) == len(codes) else None)


def _where(d: Bind, members: list[Member]) -> str:
    parts = [f"{m.node}:{','.join(m.devices) or 'cpu'}" for m in members]
    lent = f" (lent by {d.lent_from})" if d.lent_from else ""
    return f"{d.partition}{lent} -> {' '.join(parts)}"


def _failed_launch(job_id: str, attempt: int, data_dir: Path) -> Launch:
    jdir = data_dir / "jobs" / job_id
    return Launch(job_id, attempt, (), {}, (), jdir / f"attempt-{attempt}", jdir / "checkpoints")
