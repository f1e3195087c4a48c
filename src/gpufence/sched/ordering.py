"""Queue order: how a partition ranks its pending jobs (registered in ``sched/registry.py``).

The placement walk orders a partition's jobs by (rank, fair share of the queue, submit time):
a job's ``rank`` (an int, smaller first) comes first, then among equal ranks the queue with the
lowest weighted fair share, then the earliest submission. A rank is fixed while the job waits
(it is computed when the job joins its queue, again after each requeue), so queues stay sorted.
"""

from __future__ import annotations

from typing import Protocol

from gpufence.sched.jobs import JobRecord


class QueueOrder(Protocol):
    def rank(self, rec: JobRecord) -> int:
        """Smaller first; only ranks of one partition are compared."""
        ...


class PriorityFairShare:
    """The default: priority first, then weighted fair share with decay, then submit time."""

    def rank(self, rec: JobRecord) -> int:
        return -rec.job.priority
