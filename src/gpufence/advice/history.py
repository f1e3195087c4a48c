"""What a cluster did, as plain data the live rules read: jobs, attempts, notices and stops.

Two front ends build it: the control plane from its store (``control/advice_history.py``) and
the simulator from a run (``sim/advice_run.py``). Times are seconds on the front end's clock
(wall clock or virtual); ``start`` .. ``now`` is the window the advice looks at.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

# how a job's last attempt ended, as far as advice cares
ENDED_BY_ITSELF = "itself"  # its processes exited (done or failed)
ENDED_BY_CANCEL = "cancel"  # a user (or an autoscaler) cancelled it
ENDED_BY_SCHEDULER = "scheduler"  # stopped by the scheduler (reclaim, preemption, time limit)


@dataclass(frozen=True, slots=True)
class JobSpan:
    id: str
    tenant: str
    workload_class: str
    partition: str  # home partition ("" if it never resolved)
    gpus: float  # GPUs the gang holds at once (a MIG instance or a fraction counts its share)
    replicas: int
    per_replica: int  # whole GPUs per replica (1 for MIG instances and fractions)
    submitted: float
    ended: float | None  # None: pending or running at ``now``
    state: str
    ended_by: str = ""  # ENDED_BY_* once ended
    checkpointable: bool = False
    est_runtime_s: float | None = None
    slo_p99_ms: float | None = None
    queue: str = ""

    def wanted_until(self, now: float) -> float:
        return self.ended if self.ended is not None else now


@dataclass(frozen=True, slots=True)
class AttemptSpan:
    job_id: str
    attempt: int
    partition: str  # whose GPUs it ran on (the lender's, when borrowed)
    lent_from: str | None
    gpu_ids: tuple[int, ...]  # cluster GPU ids held exclusively (whole GPUs); () for shares
    gpus: float
    start: float
    end: float | None
    stop_reason: str = ""  # the scheduler's reason when it stopped the attempt
    acked: bool = False  # the job acknowledged a checkpoint before the stop
    lost_s: float | None = None  # run time lost by the stop, when the front end knows it

    def ran(self, now: float) -> float:
        return (self.end if self.end is not None else now) - self.start


@dataclass(frozen=True, slots=True)
class Mark:
    """A notice, a withdrawn notice or a stop, from the decision log."""

    t: float
    job_id: str
    kind: str  # "notice" | "notice-withdrawn" | "stop"
    reason: str  # the decision's reason (incident-preemption, lent-reclaim, idle, ...)


@dataclass(frozen=True)
class History:
    start: float
    now: float
    jobs: tuple[JobSpan, ...]
    attempts: tuple[AttemptSpan, ...]
    marks: tuple[Mark, ...]
    source: str  # "the control plane's store", "simulated run (fenced)"
    wall_clock: bool = True  # times are Unix seconds (else seconds of simulated time)

    def when(self, t: float) -> str:
        if self.wall_clock:
            return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t))
        return f"t={t / 3600:.2f} h"

    def span(self, ts: Iterable[float]) -> str:
        xs = sorted(ts)
        if not xs:
            return ""
        return self.when(xs[0]) if len(xs) == 1 else f"{self.when(xs[0])} .. {self.when(xs[-1])}"

    def job(self, job_id: str) -> JobSpan | None:
        return self._by_id().get(job_id)

    def _by_id(self) -> dict[str, JobSpan]:
        cached: dict[str, JobSpan] | None = getattr(self, "_index", None)
        if cached is None:
            cached = {j.id: j for j in self.jobs}
            object.__setattr__(self, "_index", cached)
        return cached

    def attempts_of(self, job_id: str) -> list[AttemptSpan]:
        return sorted((a for a in self.attempts if a.job_id == job_id), key=lambda a: a.attempt)

    def for_tenant(self, tenant: str) -> History:
        """Only one tenant's jobs (and their attempts and marks)."""
        ids = {j.id for j in self.jobs if j.tenant == tenant}
        return History(
            self.start,
            self.now,
            tuple(j for j in self.jobs if j.id in ids),
            tuple(a for a in self.attempts if a.job_id in ids),
            tuple(m for m in self.marks if m.job_id in ids),
            self.source,
            self.wall_clock,
        )


def peak(intervals: Iterable[tuple[float, float, float]]) -> tuple[float, float]:
    """Most weight held at once over (start, end, weight) intervals, and when; ends before
    starts at equal times (a hand-off is not an overlap)."""
    events: list[tuple[float, int, float]] = []
    for a, b, w in intervals:
        if b > a:
            events += [(a, 1, w), (b, 0, -w)]
    events.sort()
    best, at, level = 0.0, 0.0, 0.0
    for t, _, w in events:
        level += w
        if level > best + 1e-9:
            best, at = level, t
    return best, at


def pending_spans(
    job: JobSpan, attempts: list[AttemptSpan], now: float
) -> list[tuple[float, float]]:
    """When the job waited: submit -> first start, between attempts, after a requeue."""
    out: list[tuple[float, float]] = []
    since: float | None = job.submitted
    for a in attempts:
        if since is not None and a.start > since:
            out.append((since, a.start))
        since = a.end
    end = job.ended if job.ended is not None else now
    if since is not None and end > since:
        out.append((since, end))
    return out


def time_range(ts: Iterable[float]) -> tuple[float, float] | None:
    xs = list(ts)
    return (min(xs), max(xs)) if xs else None
