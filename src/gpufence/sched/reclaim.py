"""Idle reclaim of interactive sessions: warn after the idle period, reclaim after the warning.

Sessions' idle deadlines live in a heap (lazily invalidated: activity pushes a newer deadline and
the old entry is ignored when popped), so a step costs O(log n) per session due, not O(sessions).
"""

from __future__ import annotations

import heapq

from gpufence.model.decisions import Notice, Reason
from gpufence.model.job import WorkloadClass
from gpufence.sched.context import Context
from gpufence.sched.jobs import JobRecord, JobState
from gpufence.sched.jobs import Notice as NoticeState


def _deadline(ctx: Context, rec: JobRecord) -> float | None:
    """When a running, un-noticed session crosses its idle threshold; None if it cannot."""
    pol = ctx.cluster.partitions[rec.home].reclaim
    if (
        pol is None
        or rec.job.workload_class is not WorkloadClass.INTERACTIVE
        or rec.state is not JobState.RUNNING
        or rec.notice is not None
    ):
        return None
    last = rec.last_active if rec.last_active is not None else rec.started_at
    return None if last is None else last + pol.idle_after_s


def track(ctx: Context, rec: JobRecord) -> None:
    """(Re)arm the idle deadline of a session: at bind, on activity, when a warning is withdrawn."""
    t = _deadline(ctx, rec)
    if t is not None:
        heapq.heappush(ctx.idle_heap, (t, rec.job.id))


def _due(ctx: Context) -> tuple[float, JobRecord] | None:
    """The earliest valid entry, dropping stale ones."""
    heap = ctx.idle_heap
    while heap:
        t, jid = heap[0]
        rec = ctx.records.get(jid)
        if rec is not None and jid in ctx.interactive and _deadline(ctx, rec) == t:
            return t, rec
        heapq.heappop(heap)
    return None


def warn_idle(ctx: Context) -> None:
    """Warn running interactive sessions idle for longer than their partition allows."""
    while (due := _due(ctx)) is not None and due[0] <= ctx.now:
        heapq.heappop(ctx.idle_heap)
        _, rec = due
        pol = ctx.cluster.partitions[rec.home].reclaim
        assert pol is not None
        jid = rec.job.id
        last = due[0] - pol.idle_after_s
        deadline = ctx.now + pol.warning_s
        rec.notice = NoticeState(Reason.IDLE, deadline, counted=False)
        ctx.noticed[jid] = None
        msg = (
            f"idle for {ctx.now - last:.0f} s (activity < {pol.idle_threshold:g}); "
            f"GPUs reclaimed in {deadline - ctx.now:.0f} s unless it becomes active"
        )
        ctx.decisions.append(Notice(jid, Reason.IDLE, deadline, msg))


def idle_deadline(ctx: Context) -> float | None:
    """Earliest future time a running session would cross its idle threshold."""
    due = _due(ctx)
    return due[0] if due is not None else None
