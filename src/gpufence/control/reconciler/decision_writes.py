"""Scheduler decisions -> store writes + the side effects to perform (phase 3 of a cycle).

Every function writes inside the cycle's decision transaction and queues its side effect
(spawn, notice, stop) in ``Pending``; the reconciler acts only once the transaction committed.
Writing the same decisions again (after the store refused them once) gives the same result.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, assert_never

from gpufence.control.base.executor import Launch, Member
from gpufence.control.base.jobspec import StoredSpecError, from_stored
from gpufence.control.gpus.devices import DeviceError, assignment_json
from gpufence.control.reconciler.inbox import Live, Pending
from gpufence.control.reconciler.job_writes import write_cancel_decision
from gpufence.control.reconciler.launches import job_dir, launch_for
from gpufence.control.store import database as st
from gpufence.model.decisions import (
    Bind,
    Cancel,
    Decision,
    MigReconfigure,
    Notice,
    NoticeWithdrawn,
    Reject,
    Requeue,
    Stop,
)
from gpufence.model.events import Event, JobStopped
from gpufence.model.job import MILLI_PER_GPU
from gpufence.sched.jobs import JobState
from gpufence.state.ledger import charge_milli

if TYPE_CHECKING:
    from gpufence.control.reconciler.context import WriteContext
    from gpufence.control.reconciler.seam import JobTx


def write_decision(ctx: WriteContext, tx: JobTx, d: Decision, now: float, act: Pending) -> None:
    """One writer per decision type; ``assert_never`` makes mypy prove none is left out."""
    match d:
        case Bind():
            write_bind(ctx, tx, d, now, act)
        case Notice():
            write_notice(ctx, tx, d, now, act)
        case NoticeWithdrawn():
            tx.log(now, d.job_id, "notice-withdrawn", str(d.reason), d.message)
            tx.set_job(d.job_id, reason="", message="")
        case Stop():
            write_stop(ctx, tx, d, now, act)
        case Requeue():
            write_requeue(tx, d, now)
        case Reject():
            tx.set_job(
                d.job_id, state=st.REJECTED, reason=str(d.reason), message=d.message, ended_at=now
            )
            tx.log(now, d.job_id, "reject", str(d.reason), d.message)
            ctx.telemetry.rejected(str(d.reason))
        case Cancel():  # a dependency that can never be met
            write_cancel_decision(tx, d, now)
        case MigReconfigure():
            tx.log(now, None, "mig-reconfigure", str(d.reason), f"GPU {d.gpu}: {d.layout}")
            # only schedules the work (NVML on a worker thread, a timer on fake GPUs), and the
            # same decision twice schedules it once: safe when a refused transaction is
            # written again
            ctx.mig.reconfigure(d, now)
        case _:
            assert_never(d)


def write_notice(ctx: WriteContext, tx: JobTx, d: Notice, now: float, act: Pending) -> None:
    live = ctx.live.get(d.job_id)
    tx.log(now, d.job_id, "notice", str(d.reason), d.message)
    tx.set_job(d.job_id, reason=str(d.reason), message=f"notice: {d.message}")
    if live is not None:
        act.notices.append((d.job_id, live.attempt, str(d.reason), d.deadline))
    # the budget windows with the notice that may have spent them (which notices count is
    # the core's to say; a MIG defrag's is a budget of its own): a crash must not refill them
    tx.save_preemptions(ctx.scheduler.query.preemption_windows())
    tx.save_defrags(ctx.scheduler.query.defrag_windows())


def write_stop(ctx: WriteContext, tx: JobTx, d: Stop, now: float, act: Pending) -> None:
    live = ctx.live.get(d.job_id)
    tx.log(now, d.job_id, "stop", str(d.reason), d.message)
    core = ctx.scheduler.jobs().get(d.job_id)
    if core is not None and core.state in st.TERMINAL:
        # its processes exited during its notice and the core ended it in the same step (a
        # time limit's notice is not requeued): nothing is left to stop and no JobStopped will
        # come, so the job ends here, not in `stopping` for good
        tx.set_job(d.job_id, state=core.state, reason=str(d.reason), message=d.message)
        tx.set_job(d.job_id, ended_at=now)
        ctx.telemetry.stopped(str(d.reason), d.requeue)
        return
    tx.set_job(d.job_id, state=st.STOPPING, reason=str(d.reason), message=d.message)
    if live is not None:
        live.stopping, live.requeue = True, d.requeue
        tx.set_attempt(d.job_id, live.attempt, stop_reason=str(d.reason), requeue=d.requeue)
        act.stops.append((d.job_id, live.attempt))
    ctx.telemetry.stopped(str(d.reason), d.requeue)


def write_requeue(tx: JobTx, d: Requeue, now: float) -> None:
    row = tx.job(d.job_id)
    tx.set_job(
        d.job_id,
        state=st.PENDING,
        attempt=row.attempt + 1,
        started_at=None,
        reason=str(d.reason),
        message=f"requeued: {d.message}",
    )
    tx.log(now, d.job_id, "requeue", str(d.reason), f"attempt {row.attempt + 1} next")


def write_bind(ctx: WriteContext, tx: JobTx, d: Bind, now: float, act: Pending) -> None:
    row = tx.job(d.job_id)
    core = ctx.scheduler.job(d.job_id)
    nodes = ctx.scheduler.cluster.nodes
    members = []
    try:
        spec = from_stored(row.spec)
        for rank, a in enumerate(d.assignments):
            devs = ctx.devices.devices(a)
            members.append(
                Member(
                    rank,
                    nodes[a.node].name,
                    devs,
                    device_nodes=ctx.devices.nodes(a),
                    share=ctx.devices.share(a),
                )
            )
    except (DeviceError, StoredSpecError) as exc:
        # cannot be run as placed (real MIG layout drifted, a spec an older version stored):
        # fail it loudly; the empty launch reports an exit next cycle, which frees the GPUs
        # 'starting' as for any bind (the core holds it running): a cancel or stop that comes
        # before the empty launch's exit then moves it legally (starting -> stopping)
        tx.set_job(
            d.job_id,
            state=st.STARTING,
            reason="device" if isinstance(exc, DeviceError) else "invalid",
            message=str(exc),
        )
        empty = failed_launch(d.job_id, row.attempt, ctx.data_dir)
        ctx.live[d.job_id] = Live(
            row.attempt,
            empty,
            row.tenant,
            core.home,
            row.workload_class,
            from_stored({"command": ["true"]}),
        )
        act.launches.append((d.job_id, empty))
        return
    attempt = row.attempt
    cluster = ctx.scheduler.cluster
    home = cluster.partitions.get(d.partition)
    index = cluster.node_by_name
    on = [cluster.nodes[index[m.node]] for m in members if m.node in index]
    launch = launch_for(
        ctx.config, ctx.data_dir, d.job_id, attempt, row.tenant, spec, members, home, on
    )
    tx.add_attempt(
        job_id=d.job_id,
        attempt=attempt,
        pool=d.partition,
        lent_from=d.lent_from,
        assignments=[assignment_json(a) for a in d.assignments],
        devices=[list(m.devices) for m in members],
        started_at=now,
        # what its quota is charged: the GPU-equivalents history and usage count
        gpus=charge_milli(core.job, ctx.scheduler.cluster, d.partition) / MILLI_PER_GPU,
    )
    tx.set_job(
        d.job_id,
        state=st.STARTING,
        started_at=now,
        partition=core.home,
        queue=core.queue,
        reason=str(d.reason),
        message=d.message,
    )
    tx.log(now, d.job_id, "bind", str(d.reason), _where(d, members))
    ctx.live[d.job_id] = Live(attempt, launch, row.tenant, core.home, row.workload_class, spec)
    act.launches.append((d.job_id, launch))
    ctx.telemetry.bound(core.home, row.workload_class, core.queue, now - row.submitted_at)


def settle_stopped(ctx: WriteContext, tx: JobTx, events: list[Event], now: float) -> None:
    """A stop without requeue ends the job in the core without a decision: persist how."""
    for ev in events:
        if not isinstance(ev, JobStopped):
            continue
        core = ctx.scheduler.jobs().get(ev.job_id)
        if core is None or core.state is JobState.PENDING:
            continue
        # reclaimed or failed, as the core's lifecycle table says a stop ends (after_stop)
        tx.set_job(ev.job_id, state=core.state, ended_at=now)


def write_poisoned(
    ctx: WriteContext, tx: JobTx, job_id: str, why: str, now: float, act: Pending
) -> None:
    """The scheduler could not handle this job (it raised on it): the job is set aside so the
    rest of the cluster goes on; its processes, if any, are killed and it ends ``failed``."""
    msg = f"the scheduler could not handle this job ({why}); set aside"
    tx.log(now, job_id, "poisoned", "invalid", msg)
    live = ctx.live.get(job_id)
    if live is not None:
        live.cancel = True  # its exit then ends it in the core, releasing its GPUs
        tx.set_job(job_id, state=st.STOPPING, reason="invalid", message=msg)
        act.kills.append((job_id, live.attempt))
    else:
        try:
            tx.job(job_id)
        except st.StoreError:
            return
        tx.set_job(job_id, state=st.FAILED, reason="invalid", message=msg, ended_at=now)


def _where(d: Bind, members: list[Member]) -> str:
    parts = [f"{m.node}:{','.join(m.devices) or 'cpu'}" for m in members]
    lent = f" (lent by {d.lent_from})" if d.lent_from else ""
    return f"{d.partition}{lent} -> {' '.join(parts)}"


def failed_launch(job_id: str, attempt: int, data_dir: Path) -> Launch:
    jdir = job_dir(data_dir, job_id)
    return Launch(job_id, attempt, (), {}, (), jdir / f"attempt-{attempt}", jdir / "checkpoints")
