"""What flows into the reconciler (its inbox items) and what it keeps per running job.

Kept apart from the loop itself (``reconciler.py``) so that the loop reads as one cycle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from gpufence.control.executors.interface import AttemptExit, Launch
from gpufence.control.jobspec import SubmitRequest


@dataclass(frozen=True, slots=True)
class SubmitResult:
    job_id: str
    state: str
    reason: str = ""
    message: str = ""


class CancelError(ValueError):
    pass


@dataclass(slots=True)
class Submit:
    req: SubmitRequest
    tenant: str
    future: Future[SubmitResult]


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


Item = Submit | Cancel | Call | Ack | NodeEvent | AttemptExit | None
