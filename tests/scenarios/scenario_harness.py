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
from gpufence.model.job import Job, WorkloadClass
from gpufence.model.partition import LendingRule, PreemptionPolicy
from gpufence.sched.scheduler import Scheduler, SchedulerConfig
from gpufence.testing.builders import ClusterBuilder

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


def serve_and_train(pol: PreemptionPolicy | None = None, lend: int = 0) -> Scheduler:
    """Two fences of one 4-GPU node each: serve (node s-0, GPUs 0-3; admits serving, lends
    ``lend`` GPUs to train, no backfill) and train (node t-0, GPUs 4-7; admits training)."""
    lending = (LendingRule(to=("train",), cap_gpus=lend, reclaim_deadline_s=60.0),) if lend else ()
    return make(
        ClusterBuilder()
        .nodes("s", 1, gpus=4)
        .nodes("t", 1, gpus=4)
        .partition(
            "serve",
            ["s"],
            admits=frozenset({WorkloadClass.SERVING}),
            preemption=pol or PreemptionPolicy(),
            lending=lending,
            backfill=False,
        )
        .partition("train", ["t"], admits=frozenset({WorkloadClass.TRAINING}))
        .build()
    )
