"""Phase 2 of a cycle: deadlines that fell due.

- Time limits: an attempt that reaches its job's ``time_limit_s`` is stopped (reason
  ``time-limit``, not requeued: it ends failed); a checkpointable one gets a notice first, its
  home partition's ``grace_s`` before the limit, so it can checkpoint (an ack stops it then).
- Notices: a notice past its grace deadline becomes a stop (an idle session's warning ends it as
  reclaimed; a preemption or reclaim notice requeues it).
"""

from __future__ import annotations

import heapq
import math

from gpufence.model.decisions import Decision, Reason
from gpufence.sched.book import JobBook
from gpufence.sched.jobs import JobState


def expire_limits(book: JobBook, now: float) -> list[Decision]:
    out: list[Decision] = []
    while (due := book.next_limit()) is not None and due <= now:
        _, kind, jid, _, _ = heapq.heappop(book.limits)
        rec = book.records[jid]
        limit = rec.job.time_limit_s
        assert limit is not None and rec.started_at is not None
        end = rec.started_at + limit
        if kind == 1:
            msg = f"reached its time limit of {limit:g} s"
            out.append(book.stop(rec, Reason.TIME_LIMIT, False, msg, now))
        elif rec.notice is None and end > now:  # (a noticed job keeps its notice; a limit
            # already past is the stop's, due right after this)
            msg = f"time limit of {limit:g} s ends at t={end:g}: checkpoint now"
            out.append(book.notice(rec, Reason.TIME_LIMIT, end, False, msg))
    return out


def expire_notices(book: JobBook, now: float) -> list[Decision]:
    out: list[Decision] = []
    if now < _first_deadline(book):  # (every cycle: most find no notice due)
        return out
    for jid in list(book.noticed):
        rec = book.records[jid]
        n = rec.notice
        if n is None or n.deadline > now or rec.state is not JobState.RUNNING:
            continue
        if n.reason is Reason.TIME_LIMIT:
            continue  # the time limit itself stops it (expire_limits), without a requeue
        if n.reason is Reason.IDLE:
            book.counters.reclaims[Reason.IDLE] += 1
            msg = "idle session reclaimed after its warning"
            out.append(book.stop(rec, Reason.IDLE, False, msg, now))
        else:
            msg = "grace period expired without checkpoint ack"
            out.append(book.stop(rec, n.reason, True, msg, now))
    return out


def _first_deadline(book: JobBook) -> float:
    """The earliest deadline of the noticed jobs' notices (inf: none). A notice is given,
    changed or withdrawn only where ``inflight_changes`` is bumped or ``noticed`` grows."""
    key = (book.inflight_changes, len(book.noticed))
    kept_key, first = book.first_deadline
    if kept_key != key:
        records = book.records
        first = min(
            (n.deadline for j in book.noticed if (n := records[j].notice) is not None),
            default=math.inf,
        )
        book.first_deadline = (key, first)
    return first
