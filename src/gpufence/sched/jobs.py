"""The scheduler's per-job bookkeeping: lifecycle state, attempts, notices, activity."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Reason
from gpufence.model.job import Job
from gpufence.model.lifecycle import TERMINAL, JobState

__all__ = ["TERMINAL", "JobRecord", "JobState", "Notice"]  # the states live in model/lifecycle


@dataclass(slots=True)
class Notice:
    reason: Reason
    deadline: float
    counted: bool  # incident preemption (budgeted) vs lending reclaim / idle warning


@dataclass(slots=True)
class JobRecord:
    job: Job
    home: str  # resolved partition
    queue: str  # resolved queue
    state: JobState = JobState.PENDING
    attempt: int = 1
    started_at: float | None = None
    last_checkpoint: float | None = None
    last_active: float | None = None
    notice: Notice | None = None
    stop_reason: Reason | None = None
    requeue_on_stop: bool = False
    service_gpu_s: float = 0.0  # GPU-seconds held in earlier attempts (attained service)
    # its place among jobs of one submit time in its queue (sched/queues.py), taken when it
    # first joins it: a job held and released, or updated, goes back to the same place
    arrival: int = 0
    # what the job is charged in a pool (``charge_milli``), as last asked: (the job, the
    # cluster, the pool, milli). The walk asks it for every job it decides, cycle after cycle,
    # and it changes only with the job (updated: a new object) or the cluster (reloaded)
    charge: tuple[Job, Cluster, str, int] | None = field(default=None, compare=False, repr=False)

    def expected_end(self, now: float) -> float:
        """When the running job should end: at its time limit (enforced; a job past it is
        being stopped, 'now'), or by its estimate; inf when unknown -- no estimate, or the
        estimate has already proved wrong (it ran past it), so nothing should wait on it."""
        if self.started_at is None:
            return float("inf")
        limit = self.job.time_limit_s
        if limit is not None:
            return max(self.started_at + limit, now)
        est = self.job.est_runtime_s
        if est is None or self.started_at + est < now:
            return float("inf")
        return self.started_at + est

    def work_at_risk(self, now: float) -> float:
        """Seconds of work a preemption would lose (since the last checkpoint or start)."""
        since = self.last_checkpoint if self.last_checkpoint is not None else self.started_at
        return now - since if since is not None else 0.0
