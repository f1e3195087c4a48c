"""What a workload is made of, as data: the jobs to replay (``WorkItem``), how a gang talks
(``CommSpec``) and the cluster events injected at a time (``At``).

The trace loaders and the scenario generator produce these; the engine (``sim.runner``) and
the fabric model (``sim.fabric``) consume them. They live here, below both, so that reading a
trace never imports the engine (an import-linter contract in pyproject.toml keeps it so).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufence.model.events import Event
from gpufence.model.job import Job


@dataclass(frozen=True, slots=True)
class CommSpec:
    """A data-parallel gang's iteration: compute, then all-reduce ``allreduce_gb`` (1e9 B)."""

    allreduce_gb: float
    compute_s: float


@dataclass(frozen=True, slots=True)
class WorkItem:
    """A job of the workload and how it behaves once running."""

    job: Job
    duration_s: float  # run time on its GPUs, uninterrupted
    ack_after_s: float | None = 30.0  # time to checkpoint when noticed; None = never acks
    checkpoint_every_s: float | None = None  # periodic checkpoints bound the work lost
    activity: tuple[tuple[float, float], ...] = ()  # (seconds after start, utilisation)
    comm: CommSpec | None = None  # a data-parallel gang's all-reduce (the fabric model)


@dataclass(frozen=True, slots=True)
class At:
    """A cluster event (node failure, repair, ...) injected at a time."""

    time: float
    event: Event
