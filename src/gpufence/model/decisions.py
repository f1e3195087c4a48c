"""Decisions: the only things a scheduling cycle emits. Each carries a machine-readable reason."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Reason(StrEnum):
    """Machine-readable reasons, shared by decisions and pending explanations."""

    # why a job was bound
    FITS = "fits"
    BACKFILL = "backfill"  # started ahead of a reserved gang without delaying it
    LENT = "lent"  # runs on capacity another partition lends
    INCIDENT = "incident"  # serving placed on capacity freed by incident preemption
    # why a job is pending
    FENCE = "fence"
    QUOTA = "quota"
    NO_FIT = "no-fit"
    FRAGMENTED = "fragmented"
    RESERVED_FOR_GANG = "reserved-for-gang"
    MIG_LAYOUT = "mig-layout"
    WAITING_PREEMPTION = "waiting-for-preemption"
    PREEMPTION_BUDGET = "preemption-budget"
    MIN_RUNTIME = "min-runtime"  # preempting would make room, but the victims are too young
    RECONFIGURING = "mig-reconfiguring"
    QUEUED = "queued"
    HELD = "held"  # on hold until released (sched/gates.py)
    DEPENDENCY = "dependency"  # waits for other jobs to end; also why one is cancelled
    ARRAY_LIMIT = "array-limit"  # its array already has its cap of tasks queued or running
    # why a job was stopped / noticed
    INCIDENT_PREEMPTION = "incident-preemption"
    ON_DEMAND_PREEMPTION = "on-demand-preemption"
    LENT_RECLAIM = "lent-reclaim"
    MIG_DEFRAG = "mig-defrag"  # its MIG instance blocks a larger profile (sched/migdefrag_stop)
    IDLE = "idle"
    NODE_FAILURE = "node-failure"
    DRAIN = "drain"  # its node is drained with a deadline (an operator's, for maintenance)
    ACTIVE_AGAIN = "active-again"
    TIME_LIMIT = "time-limit"  # the attempt reached its job's time limit
    LOST = "lost"  # its processes were lost: the launcher died without the job's exit
    # why a job was rejected
    INVALID = "invalid"
    NEVER_FITS = "never-fits"
    DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True)
class Assignment:
    """What one replica of a gang got on one node."""

    node: int
    gpus: tuple[int, ...]  # global GPU ids
    milli: int = 1000  # share of each GPU (FRACTION); 1000 for whole GPUs
    gpu_mem_mib: int = 0
    mig_profile: str | None = None
    mig_start: int | None = None  # memory slice where the MIG instance starts
    time_sliced: bool = False


@dataclass(frozen=True, slots=True)
class Bind:
    job_id: str
    partition: str  # the partition whose GPUs it runs on
    assignments: tuple[Assignment, ...]
    reason: Reason = Reason.FITS
    message: str = ""
    lent_from: str | None = None  # set when the GPUs belong to another partition's lending


@dataclass(frozen=True, slots=True)
class Notice:
    """Start of a handshake: the job should checkpoint (or be warned) before ``deadline``."""

    job_id: str
    reason: Reason
    deadline: float
    message: str = ""


@dataclass(frozen=True, slots=True)
class NoticeWithdrawn:
    job_id: str
    reason: Reason
    message: str = ""


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop the job now. Its GPUs stay held until the front end reports JobStopped."""

    job_id: str
    reason: Reason
    requeue: bool
    message: str = ""


@dataclass(frozen=True, slots=True)
class Requeue:
    """A stopped job is back in its queue (next attempt)."""

    job_id: str
    reason: Reason
    attempt: int
    message: str = ""


@dataclass(frozen=True, slots=True)
class Reject:
    job_id: str
    reason: Reason
    message: str


@dataclass(frozen=True, slots=True)
class Cancel:
    """The scheduler ended a pending job that can never run (a dependency that can never be
    met): the front end records it ``cancelled`` with the reason."""

    job_id: str
    reason: Reason
    message: str


@dataclass(frozen=True, slots=True)
class MigReconfigure:
    """Re-partition an idle GPU; it is unusable until the front end reports MigReconfigured."""

    gpu: int
    layout: tuple[str, ...]  # "profile@start" entries
    reason: Reason
    ready_after_s: float
    message: str = ""


Decision = Bind | Notice | NoticeWithdrawn | Stop | Requeue | Reject | Cancel | MigReconfigure


@dataclass(frozen=True, slots=True)
class PendingReason:
    reason: Reason
    message: str
