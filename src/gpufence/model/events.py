"""Events: what the front ends (simulator, control plane) observed and tell the scheduler."""

from __future__ import annotations

from dataclasses import dataclass

from gpufence.model.job import Job


@dataclass(frozen=True, slots=True)
class JobSubmitted:
    job: Job


@dataclass(frozen=True, slots=True)
class JobFinished:
    """The job's processes exited on their own (success or failure)."""

    job_id: str
    succeeded: bool = True


@dataclass(frozen=True, slots=True)
class JobStopped:
    """A job the scheduler told to stop (Stop decision) has released its GPUs."""

    job_id: str


@dataclass(frozen=True, slots=True)
class JobCancelled:
    """The user cancelled the job; if running, the front end has already stopped it."""

    job_id: str


@dataclass(frozen=True, slots=True)
class CheckpointAck:
    """The job acknowledged a preemption/reclaim notice: its checkpoint is written."""

    job_id: str


@dataclass(frozen=True, slots=True)
class CheckpointWritten:
    """A periodic checkpoint finished; work since then is what a preemption would lose."""

    job_id: str


@dataclass(frozen=True, slots=True)
class Activity:
    """Activity sample of a running job (GPU utilisation 0..1), used by idle reclaim."""

    job_id: str
    utilization: float


@dataclass(frozen=True, slots=True)
class NodeDown:
    node: str


@dataclass(frozen=True, slots=True)
class NodeUp:
    node: str


@dataclass(frozen=True, slots=True)
class MigReconfigured:
    """A MIG re-partition the scheduler asked for has been applied on the GPU."""

    gpu: int


@dataclass(frozen=True, slots=True)
class Tick:
    """Nothing happened but time passed (deadlines may expire)."""


Event = (
    JobSubmitted
    | JobFinished
    | JobStopped
    | JobCancelled
    | CheckpointAck
    | CheckpointWritten
    | Activity
    | NodeDown
    | NodeUp
    | MigReconfigured
    | Tick
)
