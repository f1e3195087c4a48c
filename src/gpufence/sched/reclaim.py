"""Idle reclaim of interactive sessions: warn after the idle period, reclaim after the warning."""

from __future__ import annotations

from gpufence.model.decisions import Notice, Reason
from gpufence.model.job import WorkloadClass
from gpufence.sched.context import Context
from gpufence.sched.jobs import JobState
from gpufence.sched.jobs import Notice as NoticeState


def warn_idle(ctx: Context) -> None:
    """Warn running interactive sessions idle for longer than their partition allows."""
    for jid in ctx.interactive:
        rec = ctx.records[jid]
        pol = ctx.cluster.partitions[rec.home].reclaim
        if (
            pol is None
            or rec.job.workload_class is not WorkloadClass.INTERACTIVE
            or rec.state is not JobState.RUNNING
            or rec.notice is not None
        ):
            continue
        last = rec.last_active if rec.last_active is not None else rec.started_at
        if last is None or ctx.now - last < pol.idle_after_s:
            continue
        deadline = ctx.now + pol.warning_s
        rec.notice = NoticeState(Reason.IDLE, deadline, counted=False)
        ctx.noticed[jid] = None
        msg = (
            f"idle for {ctx.now - last:g} s (activity < {pol.idle_threshold:g}); "
            f"GPUs reclaimed at t={deadline:g} unless it becomes active"
        )
        ctx.decisions.append(Notice(jid, Reason.IDLE, deadline, msg))


def idle_deadline(ctx: Context) -> float | None:
    """Earliest future time a running session would cross its idle threshold."""
    best: float | None = None
    for jid in ctx.interactive:
        rec = ctx.records[jid]
        pol = ctx.cluster.partitions[rec.home].reclaim
        if pol is None or rec.job.workload_class is not WorkloadClass.INTERACTIVE:
            continue
        if rec.notice is not None or rec.state is not JobState.RUNNING:
            continue
        last = rec.last_active if rec.last_active is not None else rec.started_at
        if last is not None:
            t = last + pol.idle_after_s
            best = t if best is None else min(best, t)
    return best
