"""Small harness for scenario tests: drive ``Scheduler.step`` through timed steps."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Assignment, Decision
from gpufence.model.events import (
    Activity,
    CheckpointAck,
    CheckpointWritten,
    Event,
    JobCancelled,
    JobFinished,
    JobStopped,
    JobSubmitted,
    MigReconfigured,
    NodeDown,
    NodeUp,
    Tick,
)
from gpufence.model.job import Job
from gpufence.sched.scheduler import Scheduler, SchedulerConfig

Step = tuple[float, Sequence[Event]]


def make(cluster: Cluster, **config: object) -> Scheduler:
    """A scheduler with invariant validation on after every step."""
    return Scheduler(cluster, SchedulerConfig(validate=True, **config))  # type: ignore[arg-type]


def run(sched: Scheduler, steps: Iterable[Step]) -> list[list[Decision]]:
    """Run each (time, events) step; the decisions of every step, in order."""
    return [sched.step(list(events), t) for t, events in steps]


def flat(sched: Scheduler, steps: Iterable[Step]) -> list[Decision]:
    return [d for ds in run(sched, steps) for d in ds]


def sub(*jobs: Job) -> list[Event]:
    return [JobSubmitted(j) for j in jobs]


def A(node: int, *gpus: int, **kw: object) -> Assignment:
    return Assignment(node, tuple(gpus), **kw)  # type: ignore[arg-type]


__all__ = [
    "A",
    "Activity",
    "CheckpointAck",
    "CheckpointWritten",
    "JobCancelled",
    "JobFinished",
    "JobStopped",
    "JobSubmitted",
    "MigReconfigured",
    "NodeDown",
    "NodeUp",
    "Tick",
    "flat",
    "make",
    "run",
    "sub",
]
