"""Idle reclaim of interactive sessions: warn after the idle period, reclaim after the warning.

Sessions' idle deadlines live in a heap (lazily invalidated: activity pushes a newer deadline and
the old entry is ignored when popped), so a step costs O(log n) per session due, not O(sessions).
"""

from __future__ import annotations

import heapq

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Notice, Reason
from gpufence.model.job import WorkloadClass
from gpufence.sched.book import JobBook
from gpufence.sched.jobs import JobRecord, JobState


def _deadline(cluster: Cluster, rec: JobRecord) -> float | None:
    """When a running, un-noticed session crosses its idle threshold; None if it cannot."""
    pol = cluster.partitions[rec.home].reclaim
    if (
        pol is None
        or rec.job.workload_class is not WorkloadClass.INTERACTIVE
        or rec.state is not JobState.RUNNING
        or rec.notice is not None
    ):
        return None
    last = rec.last_active if rec.last_active is not None else rec.started_at
    return None if last is None else last + pol.idle_after_s


def track(cluster: Cluster, book: JobBook, rec: JobRecord) -> None:
    """(Re)arm the idle deadline of a session: at bind, on activity, when a warning is withdrawn."""
    t = _deadline(cluster, rec)
    if t is not None:
        heapq.heappush(book.idle_heap, (t, rec.job.id))


def _due(cluster: Cluster, book: JobBook) -> tuple[float, JobRecord] | None:
    """The earliest valid entry, dropping stale ones."""
    heap = book.idle_heap
    while heap:
        t, jid = heap[0]
        rec = book.records.get(jid)
        if rec is not None and jid in book.interactive and _deadline(cluster, rec) == t:
            return t, rec
        heapq.heappop(heap)
    return None


def warn_idle(cluster: Cluster, book: JobBook, now: float) -> list[Notice]:
    """Warn running interactive sessions idle for longer than their partition allows."""
    out: list[Notice] = []
    while (due := _due(cluster, book)) is not None and due[0] <= now:
        heapq.heappop(book.idle_heap)
        _, rec = due
        pol = cluster.partitions[rec.home].reclaim
        assert pol is not None
        last = due[0] - pol.idle_after_s
        deadline = now + pol.warning_s
        msg = (
            f"idle for {now - last:.0f} s (activity < {pol.idle_threshold:g}); "
            f"GPUs reclaimed in {deadline - now:.0f} s unless it becomes active"
        )
        out.append(book.notice(rec, Reason.IDLE, deadline, False, msg))
    return out


def idle_deadline(cluster: Cluster, book: JobBook) -> float | None:
    """Earliest future time a running session would cross its idle threshold."""
    due = _due(cluster, book)
    return due[0] if due is not None else None
