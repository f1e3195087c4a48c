"""Gates: pending jobs kept out of the queues until they may run at all.

A job is *gated* while it is held (``held``), waits for other jobs to end (``dependency``:
``Job.after``), or its array already has ``array_cap`` tasks queued or running
(``array-limit``). A gated job is pending but not in ``PendingQueues``, so placement, backfill,
reservations and protection never see it and cost nothing for it; once no gate blocks it, it
joins its queue like a fresh arrival (in arrival order, so an array's tasks start by index).

The cap counts tasks *queued or running* rather than only running, so the tasks released into
the queue can never exceed it whatever the placement does; a requeued task keeps its slot.

A dependency that can never be met (an after-ok parent that failed, an after-not-ok parent that
succeeded, a parent nobody knows) ends the dependent: ``advance`` returns it and the scheduler
cancels it with ``Cancel(reason=dependency)``. Pure: the job book in, verdicts out.

Gates are phase 4 of the cycle (``cycle.py``: after the events, expiries and idle warnings,
before placement), run by ``apply.open_gates``. Hooks in ``apply.py`` (each marked
``# gates``): ``admit`` at submit (instead of ``queues.add``), ``restored`` after a
``JobRestored``, ``ended`` whenever a job leaves the pending/running world,
``hold``/``release``/``outcome`` for their events; ``why`` in ``Scheduler.why_pending``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufence.model.decisions import PendingReason, Reason
from gpufence.model.job import AfterKind
from gpufence.sched.book import JobBook
from gpufence.sched.context import Claims, Core
from gpufence.sched.jobs import TERMINAL, JobRecord, JobState
from gpufence.sched.reasons import PendingReasons

_ACTIVE = (JobState.RUNNING, JobState.STOPPING)
_UNKNOWN = ("unknown", False)
_WANTS = {
    AfterKind.OK: "to succeed",
    AfterKind.ANY: "to end",
    AfterKind.NOT_OK: "to fail",
}


@dataclass(frozen=True, slots=True)
class Never:
    """A dependency of the job can never be met: it is cancelled with this message."""

    job_id: str
    message: str


@dataclass(slots=True)
class Gates:
    waiting: dict[str, JobRecord] = field(default_factory=dict)  # gated, in arrival order
    reasons: dict[str, PendingReason] = field(default_factory=dict)
    held: set[str] = field(default_factory=set)
    held_by: dict[str, str] = field(default_factory=dict)  # who held each one ("": unknown)
    outcomes: dict[str, str] = field(default_factory=dict)  # end states of untracked jobs
    arrays: dict[str, dict[str, None]] = field(default_factory=dict)  # group -> live tasks
    dirty: bool = False  # something a verdict depends on changed since the last advance

    # ------------------------------------------------------------------ hooks
    def admit(self, rec: JobRecord) -> bool:
        """A newly accepted job: True when it goes to its queue now, else it waits here."""
        job = rec.job
        if job.array_group:
            self.arrays.setdefault(job.array_group, {})[job.id] = None
        if job.held:
            self.held.add(job.id)
            self.held_by[job.id] = job.held_by
        if not (job.held or job.after or job.array_cap):
            return True
        self.waiting[job.id] = rec
        self.dirty = True
        return False

    def restored(self, rec: JobRecord) -> None:
        """A job taken back running after a restart still fills a slot of its array."""
        if rec.job.array_group:
            self.arrays.setdefault(rec.job.array_group, {})[rec.job.id] = None

    def ended(self, rec: JobRecord) -> bool:
        """A job ended (any terminal state). True when it was gated (so not in a queue)."""
        job_id = rec.job.id
        self.dirty = True
        self.held.discard(job_id)
        self.held_by.pop(job_id, None)
        self.reasons.pop(job_id, None)
        members = self.arrays.get(rec.job.array_group) if rec.job.array_group else None
        if members is not None:
            members.pop(job_id, None)
            if not members:
                del self.arrays[rec.job.array_group]
        return self.waiting.pop(job_id, None) is not None

    def hold(
        self,
        core: Core,
        book: JobBook,
        claims: Claims,
        reasons: PendingReasons,
        job_id: str,
        by: str = "",
    ) -> None:
        """Hold a pending job: out of its queue (if there) until released; ``by``: who."""
        rec = book.records.get(job_id)
        if rec is None or rec.state is not JobState.PENDING:
            return  # only pending jobs are held; the front end refuses the rest
        self.held.add(job_id)
        self.held_by[job_id] = by
        self.dirty = True
        if job_id not in self.waiting:
            core.queues.remove(job_id)
            reasons.forget(job_id)
            claims.nominations.pop(job_id, None)
            self.waiting[job_id] = rec
        self.reasons[job_id] = _held(by)

    def release(self, job_id: str) -> bool:
        """True when the job was held (it may now join its queue)."""
        if job_id not in self.held:
            return False
        self.held.discard(job_id)
        self.held_by.pop(job_id, None)
        self.dirty = True
        return True

    def outcome(self, job_id: str, state: str) -> None:
        self.outcomes[job_id] = state
        self.dirty = True

    def why(self, job_id: str) -> PendingReason | None:
        return self.reasons.get(job_id) if job_id in self.waiting else None

    # ------------------------------------------------------------------ per step
    def advance(self, core: Core, book: JobBook) -> list[Never]:
        """Re-judge every gated job: release the free ones into their queues (array tasks up to
        their cap), return those that can never run. Skipped when nothing changed."""
        if not self.dirty or not self.waiting:
            self.dirty = False
            return []
        self.dirty = False
        active = {g: _active(core, book, m) for g, m in self.arrays.items()}
        never: list[Never] = []
        for jid, rec in list(self.waiting.items()):
            blocked = self._dependencies(book, rec)
            if isinstance(blocked, Never):  # held or not: it can never run
                never.append(blocked)
                continue
            if jid in self.held:
                self.reasons[jid] = _held(self.held_by.get(jid, ""))
                continue
            if blocked is not None:
                self.reasons[jid] = blocked
                continue
            group, cap = rec.job.array_group, rec.job.array_cap
            if cap and group:
                if active.get(group, 0) >= cap:
                    msg = f"array {group} runs at most {cap} task(s) at once ({cap} already do)"
                    self.reasons[jid] = PendingReason(Reason.ARRAY_LIMIT, msg)
                    continue
                active[group] = active.get(group, 0) + 1
            del self.waiting[jid]
            self.reasons.pop(jid, None)
            core.queues.add(rec)
        return never

    def _dependencies(self, book: JobBook, rec: JobRecord) -> PendingReason | Never | None:
        """None when every dependency is met; what it waits for; or why it never will be."""
        waits: list[str] = []
        for kind, parent in rec.job.after:
            ended = _outcome(book, self.outcomes, parent)
            if ended == _UNKNOWN:
                return Never(rec.job.id, f"dependency can never be met: {parent} is unknown")
            if ended is None:
                waits.append(f"{parent} {_WANTS[kind]}")
                continue
            state, ok = ended
            if kind is AfterKind.OK and not ok:
                return Never(rec.job.id, f"dependency can never be met: {parent} {state}")
            if kind is AfterKind.NOT_OK and ok:
                return Never(
                    rec.job.id, f"dependency can never be met: {parent} {state} (after-not-ok)"
                )
        if not waits:
            return None
        return PendingReason(Reason.DEPENDENCY, "waiting for " + ", ".join(waits))


def _held(by: str) -> PendingReason:
    who = f" by {by}" if by else ""
    return PendingReason(Reason.HELD, f"held{who}; release it to let it run")


def _active(core: Core, book: JobBook, members: dict[str, None]) -> int:
    """Tasks of an array that hold a slot of its cap: running, stopping, or queued."""
    n = 0
    for jid in members:
        rec = book.records.get(jid)
        if rec is not None and (rec.state in _ACTIVE or jid in core.queues):
            n += 1
    return n


def _outcome(book: JobBook, outcomes: dict[str, str], job_id: str) -> tuple[str, bool] | None:
    """(how it ended, whether it succeeded) of a parent, or None while it has not ended."""
    rec = book.records.get(job_id)
    if rec is not None:
        if rec.state not in TERMINAL:
            return None
        return str(rec.state), rec.state is JobState.DONE
    if job_id in outcomes:
        return outcomes[job_id], outcomes[job_id] == JobState.DONE
    return _UNKNOWN
