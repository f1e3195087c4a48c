"""The job lifecycle: every state a job can be in, the legal transitions, and what a decision
does to a job's state. The core, the store, the CLI and the simulator all use this one table.

    pending ──Bind──▶ (starting) ──▶ running ──Stop──▶ stopping ──stopped──▶ pending (requeue)
       │                  │             │                                 ├▶ reclaimed (idle)
       │                  │             └──finished──▶ done | failed      └▶ failed
       └──Reject──▶ rejected           any live state ──cancel──▶ cancelled

``starting`` is the control plane's own: a Bind that is persisted while its processes are being
spawned. The scheduler goes from pending straight to running.
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

#: state -> the states it may move to (terminal states move nowhere)
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _P: frozenset({_S, _R, _C, _RJ, _F}),  # failed: a front end gives up (lost too often)
    _S: frozenset({_R, _X, _D, _F, _C, _P}),  # pending: its launch was lost and it is requeued
    _R: frozenset({_X, _D, _F, _C, _P}),
    _X: frozenset({_P, _RC, _F, _D, _C}),
    _D: frozenset(),
    _F: frozenset(),
    _C: frozenset(),
    _RC: frozenset(),
    _RJ: frozenset(),
}

TERMINAL: frozenset[JobState] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
ACTIVE: tuple[JobState, ...] = (_S, _R, _X)  # holds (or is about to hold) GPUs
STATES: tuple[JobState, ...] = tuple(JobState)  # in lifecycle order
TERMINAL_STATES: tuple[JobState, ...] = tuple(s for s in STATES if s in TERMINAL)
LIVE_STATES: tuple[JobState, ...] = tuple(s for s in STATES if s not in TERMINAL)


def legal(old: JobState, new: JobState) -> bool:
    return new in TRANSITIONS[old]


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
