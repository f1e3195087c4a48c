"""Events: what the front ends (simulator, control plane) observed and tell the scheduler."""

from __future__ import annotations

from dataclasses import dataclass

from gpufence.model.decisions import Assignment, Reason
from gpufence.model.job import Job


@dataclass(frozen=True, slots=True)
class JobSubmitted:
    job: Job


@dataclass(frozen=True, slots=True)
class JobRestored:
    """A front end restarted and found this job still holding GPUs (its processes alive).

    The scheduler takes it back exactly where it runs, without a Bind. ``stopping`` is set when
    the front end had already been told to stop it (the Stop is not repeated); ``requeue`` is
    what that Stop said. ``notice`` is a notice the job had been given and had not yet answered
    (its reason and deadline): it is taken back as it was, not given again.
    """

    job: Job
    pool: str
    assignments: tuple[Assignment, ...]
    attempt: int = 1
    started_at: float = 0.0
    lent_from: str | None = None
    stopping: Reason | None = None
    requeue: bool = False
    notice: tuple[Reason, float] | None = None


@dataclass(frozen=True, slots=True)
class UsageRestored:
    """A front end restarted: each queue's decayed fair-share usage (milli-GPU-seconds) as it
    saved it at time ``at``. Without it a restart would forgive every tenant its history."""

    usage: tuple[tuple[str, float], ...]
    at: float


@dataclass(frozen=True, slots=True)
class PreemptionsRestored:
    """A front end restarted: when the incident preemptions still counted against each
    partition's budget were made, as it saved them. Without it a restart would hand every fence
    a fresh budget (a crash loop would preempt without limit)."""

    times: tuple[tuple[str, tuple[float, ...]], ...]


@dataclass(frozen=True, slots=True)
class DefragsRestored:
    """A front end restarted: when the MIG defrag stops still counted against each MIG pool's
    ``defrag_budget`` were made, as it saved them. Without it a restart would hand every pool
    a fresh defrag budget (a crash loop would stop checkpointable jobs without limit)."""

    times: tuple[tuple[str, tuple[float, ...]], ...]


@dataclass(frozen=True, slots=True)
class JobFinished:
    """The job's processes exited on their own (success or failure)."""

    job_id: str
    succeeded: bool = True


@dataclass(frozen=True, slots=True)
class JobLost:
    """The attempt's processes are gone without an exit of their own (its launcher was killed
    by someone else: the OOM killer, an operator): its outcome is unknown, so it is stopped and
    requeued as the next attempt, as a node failure would. A front end sends it only while the
    job has attempts left (``max_attempts``); after that, a failed ``JobFinished``."""

    job_id: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class JobStopped:
    """A job the scheduler told to stop (Stop decision) has released its GPUs."""

    job_id: str


@dataclass(frozen=True, slots=True)
class JobCancelled:
    """The user cancelled the job; if running, the front end has already stopped it."""

    job_id: str


@dataclass(frozen=True, slots=True)
class JobHeld:
    """The user put a pending job on hold: it waits (reason ``held``) until released.
    ``by``: who held it, named in the pending reason ("held by alice")."""

    job_id: str
    by: str = ""


@dataclass(frozen=True, slots=True)
class JobReleased:
    """The user released a held job."""

    job_id: str


@dataclass(frozen=True, slots=True)
class JobUpdated:
    """A user changed a job, as Slurm's ``scontrol update`` (None: that field unchanged).

    A pending job takes every field: it is routed again as at submit (``sched/update.judge``:
    its partition and queue resolved, a request no partition can hold refused) and keeps its
    place in its queue's order by submit time. A running one takes a new priority and time
    limit (the limit counts from the attempt's start, as before), never a new partition or
    queue. The front end judges the change with the same ``judge`` before it sends it, and
    refuses what it says; the core drops a change that no longer applies (the job ended)."""

    job_id: str
    priority: int | None = None
    time_limit_s: float | None = None
    partition: str | None = None
    queue: str | None = None


@dataclass(frozen=True, slots=True)
class OutcomeKnown:
    """How a job the core does not track ended (before a front-end restart): what a dependency
    on it needs to know. ``state``: the state it ended in (``done`` is success)."""

    job_id: str
    state: str


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
    """The node takes no new work. ``stop_jobs``: it failed, so what ran there is stopped (and
    requeued); False: it was cordoned (Kubernetes' ``unschedulable``, a NoSchedule taint), so
    what runs there keeps running until it ends."""

    node: str
    stop_jobs: bool = True


@dataclass(frozen=True, slots=True)
class NodeUp:
    node: str


@dataclass(frozen=True, slots=True)
class MigReconfigured:
    """A MIG re-partition the scheduler asked for has been applied on the GPU."""

    gpu: int


@dataclass(frozen=True, slots=True)
class MigLayoutRead:
    """The front end read a GPU's MIG instances off the device: at start-up, or after a
    re-partition it was asked for failed part-way (``failed`` says why).

    The core takes ``layout`` ("profile@start" entries) as the GPU's instances and drops any
    re-partition in flight on it, so the jobs waiting for it are placed again. ``usable=False``
    takes the GPU out of placement (e.g. its MIG mode does not match its partition).
    """

    gpu: int
    layout: tuple[str, ...]
    usable: bool = True
    failed: str = ""
    # the GPU is being re-cut into ``layout`` (a front end that restarted mid-re-cut): it takes
    # no job until ``MigReconfigured``, and jobs that fit the new instances wait for them
    recutting: bool = False


@dataclass(frozen=True, slots=True)
class QueueRetuned:
    """The admin changed a queue's fair-share weight or nominal quota at run time (the control
    plane's ``queue set``): from this step on the core ranks and admits with the new values.
    Work already running above a lowered quota keeps running; the quota only blocks new work."""

    queue: str
    weight: float
    nominal_milli: int | None  # None: the queue has no quota


@dataclass(frozen=True, slots=True)
class TenantsChanged:
    """The set of tenants changed at run time (a tenant added or removed): queue labels that
    name a tenant are that tenant's, the others nobody's (``SchedulerConfig.tenants``)."""

    tenants: frozenset[str]


@dataclass(frozen=True, slots=True)
class NodeDrained:
    """An operator drained the node: no new work is placed on it; what runs there finishes, or,
    with a ``deadline`` (the core's time), is noticed now and stopped (requeued) by then.
    Draining a drained node again replaces its reason and deadline."""

    node: str
    reason: str
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class NodeUndrained:
    node: str


@dataclass(frozen=True, slots=True)
class MaintenanceScheduled:
    """A maintenance window on ``nodes`` over [start, end) (the core's time): while it lasts the
    nodes take no work, and before it a job starts on them only if its time limit ends by
    ``start`` (a job without one is unbounded). The same ``window_id`` again replaces it."""

    window_id: str
    nodes: tuple[str, ...]
    start: float
    end: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class MaintenanceCancelled:
    window_id: str


@dataclass(frozen=True, slots=True)
class Tick:
    """Nothing happened but time passed (deadlines may expire)."""


Event = (
    JobSubmitted
    | JobRestored
    | UsageRestored
    | PreemptionsRestored
    | DefragsRestored
    | JobFinished
    | JobLost
    | JobStopped
    | JobCancelled
    | JobHeld
    | JobReleased
    | JobUpdated
    | OutcomeKnown
    | CheckpointAck
    | CheckpointWritten
    | Activity
    | NodeDown
    | NodeUp
    | NodeDrained
    | NodeUndrained
    | MaintenanceScheduled
    | MaintenanceCancelled
    | MigReconfigured
    | MigLayoutRead
    | QueueRetuned
    | TenantsChanged
    | Tick
)
