"""What flows into the reconciler (its inbox items) and what it keeps per running job.

Kept apart from the loop itself (``loop.py``) so that the loop reads as one cycle.
*Requests* (``Submit``, ``Cancel``) wait on a future: if the store cannot take them they fail
with ``StoreUnavailable`` and the client retries. *Observations* (``AttemptExit``, ``Ack``,
``NodeEvent``) have nobody to retry them: the reconciler holds each one until a cycle has
persisted it and the scheduler has seen it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from gpufence.control.base.executor import AttemptExit, Launch
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.model.decisions import Decision
from gpufence.model.events import Event, JobRestored, JobSubmitted
from gpufence.sched.jobs import JobRecord


@dataclass(frozen=True, slots=True)
class SubmitResult:
    job_id: str
    state: str
    reason: str = ""
    message: str = ""
    replayed: bool = False
    """The Idempotency-Key was seen before: this is the job it created then."""
    tasks: tuple[str, ...] = ()
    """An array: the id of every task, in index order (``job_id`` is the first)."""
    array: str = ""
    """An array: its own id (which every task's ``array_task.job`` names)."""


def reply(fut: Future[Any], value: object) -> None:
    """Answer a waiting caller (an exception value is raised to it). A caller that gave up has
    cancelled its future (an HTTP submit that timed out: asyncio cancels the future it wraps):
    it gets nothing, and the cycle goes on; a late answer must never abort the cycle between
    a commit and its side effects (a bind committed, its processes never spawned)."""
    try:
        if isinstance(value, BaseException):
            fut.set_exception(value)
        else:
            fut.set_result(value)
    except InvalidStateError:
        pass


class CancelError(ValueError):
    pass


class InvalidField(ValueError):
    """A request field that passed validation but cannot work here (HTTP 422 naming it)."""

    def __init__(self, loc: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


class NotPermitted(PermissionError):
    """The caller may not make this change to its job (HTTP 403): the message names the rule
    and who may (``update_writes``)."""


@dataclass(slots=True)
class Action:
    """Hold, release or update a job (``job_actions.py``, ``update_routes.py``); answered with
    its state."""

    job_id: str
    kind: str  # "hold" | "release" | "update"
    future: Future[str]
    by: str = ""  # the caller's tenant ("admin" for the admin token)
    changes: dict[str, Any] = field(default_factory=dict)  # an update's (jobupdate.FIELDS)


class TenantRemoved(PermissionError):
    """A submit of a tenant the admin removed after its token was checked (HTTP 403): tenant
    removal and submits are both written on the reconciler thread, so none slips in after."""


class PendingCapReached(ValueError):
    """A submit that would take its tenant past its cap on pending jobs (HTTP 429)."""


class IdempotencyConflict(ValueError):
    """An Idempotency-Key reused for a different request (HTTP 422)."""


@dataclass(slots=True)
class Submit:
    req: SubmitRequest
    tenant: str
    future: Future[SubmitResult]
    key: str | None = None
    """The client's Idempotency-Key (per tenant): the same key returns the same job."""
    stored: tuple[dict[str, Any], str] | None = None
    """``req.stored()`` and its ``spec_text``, made on the caller's thread (``Reconciler.submit``)
    while the cycle waits for the batch's other requests, not in the cycle for each."""


@dataclass(slots=True)
class Cancel:
    job_id: str
    future: Future[str]


@dataclass(slots=True)
class Call:
    fn: Callable[[Any], Any]  # called with the reconciler, on its thread
    future: Future[Any]


@dataclass(slots=True)
class Ack:
    job_id: str
    attempt: int


@dataclass(slots=True)
class NodeEvent:
    node: str
    up: bool


@dataclass(slots=True)
class Live:
    """What the reconciler knows about a job whose processes may exist."""

    attempt: int
    launch: Launch
    tenant: str
    partition: str
    workload_class: str
    spec: SubmitRequest
    stopping: bool = False  # the scheduler said Stop
    requeue: bool = False
    cancel: bool = False  # the user cancelled it
    orphan: bool = False  # ended while the control plane was down; not in the scheduler


@dataclass(slots=True)
class Clock:
    """Wall time that never goes backwards (the scheduler refuses time travel)."""

    last: float = 0.0
    source: Callable[[], float] = time.time

    def __call__(self) -> float:
        self.last = max(self.last, self.source())
        return self.last


@dataclass(slots=True)
class Pending:
    """Per-cycle bookkeeping while decisions are applied."""

    launches: list[tuple[str, Launch]] = field(default_factory=list)
    notices: list[tuple[str, int, str, float]] = field(default_factory=list)
    stops: list[tuple[str, int]] = field(default_factory=list)
    kills: list[tuple[str, int]] = field(default_factory=list)
    """Stops without grace: attempts of jobs the scheduler could not handle."""


Observation = AttemptExit | Ack | NodeEvent


@dataclass(frozen=True, slots=True)
class Home:
    """A new job's partition and queue as inserted (those the core will resolve, predicted
    with its own ``resolve``) and as the request named them (kept for a job it rejects)."""

    job_id: str
    stored: tuple[str, str]
    asked: tuple[str, str]


@dataclass(slots=True)
class Staged:
    """What one inbox transaction wrote, applied in memory only once it committed."""

    events: list[Event] = field(default_factory=list)
    submits: list[tuple[str, Future[SubmitResult]]] = field(default_factory=list)
    replies: list[tuple[Future[Any], object]] = field(default_factory=list)
    """Futures answered once the transaction committed (a value, or an exception)."""
    effects: list[Callable[[], None]] = field(default_factory=list)
    """In-memory changes that must follow the commit (never precede it)."""
    stops: list[tuple[str, int]] = field(default_factory=list)
    exits: int = 0
    homes: list[Home] = field(default_factory=list)
    """Where each new job was stored (``job_writes.insert_job``)."""

    def mark(self) -> tuple[int, ...]:
        """Where each list ends now: ``rewind`` drops what was staged after it."""
        return (
            len(self.events),
            len(self.submits),
            len(self.replies),
            len(self.effects),
            len(self.stops),
            self.exits,
            len(self.homes),
        )

    def rewind(self, mark: tuple[int, ...]) -> None:
        """Undo what was staged since ``mark`` (its writes were rolled back)."""
        del self.events[mark[0] :], self.submits[mark[1] :], self.replies[mark[2] :]
        del self.effects[mark[3] :], self.stops[mark[4] :], self.homes[mark[6] :]
        self.exits = mark[5]


@dataclass(slots=True)
class Unsaved:
    """A scheduling step whose decisions are not persisted yet (the store refused them): it is
    persisted before anything else happens, then acted on."""

    events: list[Event]
    decisions: list[Decision]
    submits: list[tuple[str, Future[SubmitResult]]]
    stops: list[tuple[str, int]]
    poisoned: dict[str, str]
    """Jobs the scheduler could not handle, and why."""
    homes: list[Home] = field(default_factory=list)


Item = Submit | Cancel | Action | Call | Ack | NodeEvent | AttemptExit | None


def job_of(ev: Event) -> str | None:
    """The job an event is about (None: a node or cluster event)."""
    if isinstance(ev, JobSubmitted | JobRestored):
        return ev.job.id
    job_id = getattr(ev, "job_id", None)
    return job_id if isinstance(job_id, str) else None


def kind_of(ob: object) -> str:
    """What an observation is, in the words of the reconciler's log."""
    return {AttemptExit: "exit", Ack: "checkpoint ack", NodeEvent: "node event"}.get(
        type(ob), "observation"
    )


def wrong_homes(jobs: Mapping[str, JobRecord], homes: list[Home]) -> list[tuple[str, str, str]]:
    """(job, partition, queue) of each new job stored with another home than the one the
    scheduler resolved (or, for a job it rejected, than the request named)."""
    out = []
    for h in homes:
        core = jobs.get(h.job_id)
        want = (core.home, core.queue) if core is not None and core.home else h.asked
        if want != h.stored:
            out.append((h.job_id, *want))
    return out
