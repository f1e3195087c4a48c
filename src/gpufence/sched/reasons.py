"""Why pending jobs wait: per job, per shape (its jobs share the reason) and per partition.

Each answer is stamped with the cycle that set it; the newest answer wins, and on a tie the
job's own reason wins over its shape's, which wins over its partition's. A shape's reason costs
one entry however many jobs it has, which keeps a 10,000-job queue cheap to explain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufence.model.decisions import PendingReason, Reason
from gpufence.sched.queues import PendingQueues, ShapeKey


@dataclass(slots=True)
class PendingReasons:
    cycle: int = 0  # the placement cycle answers set now are stamped with
    job: dict[str, tuple[int, PendingReason]] = field(default_factory=dict)
    shape: dict[ShapeKey, tuple[int, PendingReason]] = field(default_factory=dict)
    partition: dict[str, tuple[int, PendingReason]] = field(default_factory=dict)

    def why(self, job_id: str, queues: PendingQueues) -> PendingReason | None:
        """The newest reason for a pending job: its own, its shape's or its partition's."""
        best = self.job.get(job_id)
        if job_id in queues:
            for other in (
                self.shape.get(queues.shape_of(job_id)),
                self.partition.get(queues.records[job_id].home),
            ):
                if other is not None and (best is None or other[0] > best[0]):
                    best = other
        return best[1] if best is not None else None

    def newest(self, job_id: str, shape: ShapeKey, home: str) -> PendingReason | None:
        """``why`` for a job the caller knows is queued, with its shape and home partition."""
        best = self.job.get(job_id)
        other = self.shape.get(shape)
        if other is not None and (best is None or other[0] > best[0]):
            best = other
        other = self.partition.get(home)
        if other is not None and (best is None or other[0] > best[0]):
            best = other
        return best[1] if best is not None else None

    def set_job(self, job_id: str, reason: Reason, message: str) -> None:
        self.job[job_id] = (self.cycle, _answer(self.job.get(job_id), reason, message))

    def set_jobs(self, job_ids: list[str], reason: Reason, message: str) -> None:
        """The same reason for many jobs (one answer object shared: answers are immutable)."""
        answer = (self.cycle, PendingReason(reason, message))
        for jid in job_ids:
            self.job[jid] = answer

    def set_shape(self, shape: ShapeKey, reason: Reason, message: str) -> None:
        self.shape[shape] = (self.cycle, _answer(self.shape.get(shape), reason, message))

    def set_partition(self, partition: str, reason: Reason, message: str) -> None:
        self.partition[partition] = (self.cycle, PendingReason(reason, message))

    def forget(self, job_id: str) -> None:
        """The job left the queue (bound or ended): its own reason goes with it."""
        self.job.pop(job_id, None)


def _answer(old: tuple[int, PendingReason] | None, reason: Reason, message: str) -> PendingReason:
    """The answer to store: the one stored before when it says the same (answers are
    immutable; most walks tell a waiting shape what they told it last cycle, and making an
    answer anew cost more than comparing it)."""
    if old is not None and old[1].reason is reason and old[1].message == message:
        return old[1]
    return PendingReason(reason, message)
