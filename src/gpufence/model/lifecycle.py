"""The job lifecycle: every state a job can be in, the legal transitions, and what a decision
does to a job's state. The core, the store, the CLI and the simulator all use this one table.

    pending ──Bind──▶ (starting) ──▶ running ──Stop──▶ stopping ──stopped──▶ pending (requeue)
       │                  │             │                                 ├▶ reclaimed (idle)
       │                  │             └──finished──▶ done | failed      └▶ failed
       └──Reject──▶ rejected           any live state ──cancel──▶ cancelled

``starting`` is the control plane's own: a Bind that is persisted while its processes are being
spawned. The scheduler goes from pending straight to running.

Every front end holds its state changes to the table and raises on a move it does not have: the
core (``sched/book.JobBook.move``), the control plane's store (``Tx.set_job``) and the simulator
(``JobTrace.move_to``); tests/unit/test_lifecycle_front_ends.py replays one scenario through the
last two and compares what each job went through.
"""

from __future__ import annotations

from enum import StrEnum

from gpufence.model.decisions import Bind, Decision, Reason, Reject, Requeue, Stop


class JobState(StrEnum):
    PENDING = "pending"
    STARTING = "starting"  # control plane only: bound and persisted, processes being spawned
    RUNNING = "running"
    STOPPING = "stopping"  # told to stop; GPUs held until the front end confirms
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RECLAIMED = "reclaimed"  # idle interactive session whose GPUs were taken back
    REJECTED = "rejected"


_P, _S, _R, _X = JobState.PENDING, JobState.STARTING, JobState.RUNNING, JobState.STOPPING
_D, _F, _C = JobState.DONE, JobState.FAILED, JobState.CANCELLED
_RC, _RJ = JobState.RECLAIMED, JobState.REJECTED

#: every legal move of a job's state, one edge a line, with what causes it
EDGES: tuple[tuple[JobState, JobState], ...] = (
    (_P, _S),  # control plane: a Bind persisted, processes being spawned
    (_P, _R),  # core and simulator: a Bind (they have no ``starting``)
    (_P, _C),  # cancelled in its queue (a user, or a dependency that can never be met)
    (_P, _RJ),  # a Reject (can never run here), or a restart finds its stored spec unreadable
    (_P, _F),  # control plane: its Bind could not be carried out (devices, spec), or set aside
    (_S, _R),  # control plane: every process of the attempt was spawned
    (_S, _X),  # a Stop or a cancel before the spawn was recorded
    (_S, _D),  # it exited 0 before its spawn was recorded, or a restart finds it completed
    (_S, _F),  # its processes could not be started, or it failed before being marked running
    (_S, _C),  # cancelled and its processes gone before the spawn was recorded
    (_S, _P),  # control plane, at a restart: the attempt was lost while it was down; requeued
    (_R, _X),  # a Stop (preemption, time limit, idle reclaim, node failure) or a cancel
    (_R, _D),  # every member exited 0
    (_R, _F),  # a member failed, or it was lost with no attempt left
    (_R, _C),  # core and simulator: cancelled while running (the control plane stops first)
    (_R, _P),  # control plane, at a restart: the attempt was lost while it was down; requeued
    (_X, _P),  # the stop confirmed and the Stop said requeue: back in its queue
    (_X, _RC),  # the stop of an idle session confirmed: its GPUs taken back
    (_X, _F),  # the stop of one that is not requeued (e.g. a time limit) confirmed
    (_X, _D),  # every member had exited 0 before the stop reached it
    (_X, _C),  # a cancel's stop confirmed: its processes are gone
)

#: state -> the states it may move to (terminal states move nowhere)
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    s: frozenset(new for old, new in EDGES if old is s) for s in JobState
}

TERMINAL: frozenset[JobState] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
ACTIVE: tuple[JobState, ...] = (_S, _R, _X)  # holds (or is about to hold) GPUs
STATES: tuple[JobState, ...] = tuple(JobState)  # in lifecycle order
TERMINAL_STATES: tuple[JobState, ...] = tuple(s for s in STATES if s in TERMINAL)
LIVE_STATES: tuple[JobState, ...] = tuple(s for s in STATES if s not in TERMINAL)


def legal(old: JobState, new: JobState) -> bool:
    return new in TRANSITIONS[old]


def legal_names(old: object, new: object) -> bool:
    """``legal`` for states as a store keeps them (text); a state it does not know has no move."""
    try:
        return legal(JobState(str(old)), JobState(str(new)))
    except ValueError:
        return False


class IllegalTransition(RuntimeError):
    """A front end tried to move a job along a transition the lifecycle table does not have:
    a bug in that front end."""

    def __init__(self, job_id: str, old: JobState, new: JobState) -> None:
        super().__init__(f"job {job_id}: {old} -> {new} is not a move of the job lifecycle")
        self.job_id, self.old, self.new = job_id, old, new


def check_move(job_id: str, old: JobState, new: JobState) -> None:
    """``IllegalTransition`` unless the table has ``old -> new``."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(job_id, old, new)


def after_stop(reason: Reason, requeue: bool) -> JobState:
    """Where a stopped job ends once its GPUs are released: back in its queue when the Stop
    said requeue, reclaimed when it was an idle session, failed otherwise (e.g. a time limit)."""
    if requeue:
        return _P
    return _RC if reason is Reason.IDLE else _F


def state_after(d: Decision) -> JobState | None:
    """The state a decision moves its job to (None: the decision changes no job's state)."""
    if isinstance(d, Bind):
        return _R
    if isinstance(d, Stop):
        return _X
    if isinstance(d, Requeue):
        return _P
    if isinstance(d, Reject):
        return _RJ
    return None
