"""Phase 2 of a cycle: deadlines that fell due. A notice past its grace deadline becomes a stop
(an idle session's warning ends it as reclaimed; a preemption or reclaim notice requeues it)."""

from __future__ import annotations

from gpufence.model.decisions import Decision, Reason
from gpufence.sched.book import JobBook
from gpufence.sched.jobs import JobState


def expire_notices(book: JobBook, now: float) -> list[Decision]:
    out: list[Decision] = []
    for jid in list(book.noticed):
        rec = book.records[jid]
        n = rec.notice
        if n is None or n.deadline > now or rec.state is not JobState.RUNNING:
            continue
        if n.reason is Reason.IDLE:
            book.counters.reclaims[Reason.IDLE] += 1
            msg = "idle session reclaimed after its warning"
            out.append(book.stop(rec, Reason.IDLE, False, msg, now))
        else:
            msg = "grace period expired without checkpoint ack"
            out.append(book.stop(rec, n.reason, True, msg, now))
    return out
