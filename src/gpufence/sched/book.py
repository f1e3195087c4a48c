"""The job book: every job the scheduler knows, its lifecycle moves, and the indexes over the
running ones that the phases look up (noticed jobs, reclaimable sessions, checkpointable starts
in donor pools, time limits), with the counters the front ends report.

Every state change of a job goes through ``move``, which holds it to the lifecycle table
(``model/lifecycle.py``): an illegal transition is a bug in the core and raises.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from dataclasses import dataclass, field

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Notice, Reason, Stop
from gpufence.model.lifecycle import TRANSITIONS, JobState
from gpufence.model.partition import PreemptionMode
from gpufence.sched.context import Core, Nomination
from gpufence.sched.jobs import JobRecord
from gpufence.sched.jobs import Notice as NoticeState


class IllegalTransition(AssertionError):
    """The core tried to move a job along a transition the lifecycle table does not have."""


@dataclass
class Counters:
    binds: int = 0
    rejects: int = 0
    preemptions: Counter[str] = field(default_factory=Counter)
    reclaims: Counter[str] = field(default_factory=Counter)
    gpu_seconds_lost: float = 0.0
    requeues: int = 0


class JobBook:
    def __init__(self, cluster: Cluster) -> None:
        self.records: dict[str, JobRecord] = {}
        self.counters = Counters()
        self.noticed: dict[str, None] = {}  # running jobs with a notice
        self.stopping: dict[str, None] = {}  # told to stop, GPUs not yet released
        self.inflight_changes = 0  # bumped whenever ``noticed`` or ``stopping`` changes here
        # the earliest deadline of a notice, as of (inflight_changes, len(noticed)) (expiry.py)
        self.first_deadline: tuple[tuple[int, int], float] = ((-1, -1), 0.0)
        self.interactive: dict[str, None] = {}  # running, reclaim-eligible
        self.idle_heap: list[tuple[float, str]] = []  # (idle deadline, job), see sched/reclaim
        # time limits: (when, 0 = notice / 1 = stop, job, start of the attempt, the limit),
        # lazily invalid: another attempt, or a limit changed since (sched/update.py)
        self.limits: list[tuple[float, int, str, float, float]] = []
        # per donor pool: (start, job) of the binds that may become victims (checkpointable
        # ones; every job where on-demand preemption draws on the pool) in start order, so
        # protection finds the next victim to age past its minimum runtime without scanning
        # every job
        self.starts: dict[str, deque[tuple[float, str]]] = {}
        # donor pool -> the longest minimum runtime of the policies drawing on it
        self.donor_min_runtime: dict[str, float] = {}
        self.on_demand_donors: set[str] = set()
        for part in cluster.partitions.values():
            pol = part.preemption
            for pool in pol.from_partitions:
                prev = self.donor_min_runtime.get(pool, 0.0)
                self.donor_min_runtime[pool] = max(prev, pol.min_runtime_s)
                if pol.mode is PreemptionMode.ON_DEMAND:
                    self.on_demand_donors.add(pool)

    @staticmethod
    def move(rec: JobRecord, new: JobState) -> None:
        if new not in TRANSITIONS[rec.state]:
            raise IllegalTransition(f"job {rec.job.id}: {rec.state} -> {new}")
        rec.state = new

    def note_start(self, pool: str, job_id: str, now: float) -> None:
        """Remember a checkpointable bind in a donor pool (see ``starts``); entries past every
        policy's minimum runtime are dropped here too, so the deque stays short."""
        longest = self.donor_min_runtime.get(pool)
        if longest is None:
            return
        starts = self.starts.setdefault(pool, deque())
        while starts and starts[0][0] + longest <= now:
            starts.popleft()
        starts.append((now, job_id))

    def arm_limit(self, rec: JobRecord, grace_s: float) -> None:
        """A started attempt with a time limit is stopped at it; a checkpointable one is first
        noticed ``grace_s`` before, to checkpoint (sched/expiry.py)."""
        limit, start = rec.job.time_limit_s, rec.started_at
        if limit is None or start is None:
            return
        end = start + limit
        if rec.job.checkpointable:
            notice = max(start, end - grace_s)
            heapq.heappush(self.limits, (notice, 0, rec.job.id, start, limit))
        heapq.heappush(self.limits, (end, 1, rec.job.id, start, limit))

    def next_limit(self) -> float | None:
        """When the next time-limit notice or stop falls due (stale entries dropped)."""
        heap = self.limits
        while heap:
            _, _, jid, start, limit = heap[0]
            rec = self.records.get(jid)
            if (
                rec is not None
                and rec.state is JobState.RUNNING
                and rec.started_at == start
                and rec.job.time_limit_s == limit
            ):
                return heap[0][0]
            heapq.heappop(heap)
        return None

    def waiting_on(self, nom: Nomination) -> bool:
        """Some victim of ``nom`` still holds its GPUs (noticed, or told to stop). A victim that
        was requeued, ended, or started again elsewhere is no longer waited for."""
        return any(v in self.noticed or v in self.stopping for v in nom.victims)

    def waiting_for(self, victims: dict[str, None]) -> str:
        """A pending reason for a job that waits for ``victims``: who, and by when."""
        left = [v for v in victims if v in self.noticed or v in self.stopping]
        deadlines = [n.deadline for v in left if (n := self.records[v].notice) is not None]
        when = f" (notice deadline t={max(deadlines):g})" if deadlines else ""
        told = " (stopping)" if left and not deadlines else ""
        return f"waiting for {', '.join(left) or 'nothing'} to stop{when}{told}"

    def on_the_way_back(self) -> list[str]:
        """Running jobs whose GPUs will come back: noticed, or told to stop."""
        return [*self.noticed, *(j for j in self.stopping if j not in self.noticed)]

    def notice(
        self, rec: JobRecord, reason: Reason, deadline: float, counted: bool, why: str
    ) -> Notice:
        """Ask a running job to wrap up (checkpoint, or be warned) before ``deadline``."""
        rec.notice = NoticeState(reason, deadline, counted)
        self.noticed[rec.job.id] = None
        self.inflight_changes += 1
        return Notice(rec.job.id, reason, deadline, why)

    def withdraw(self, rec: JobRecord) -> None:
        rec.notice = None
        self.noticed.pop(rec.job.id, None)
        self.inflight_changes += 1

    def stop(self, rec: JobRecord, reason: Reason, requeue: bool, message: str, now: float) -> Stop:
        if rec.notice is not None and rec.notice.counted:
            self.counters.gpu_seconds_lost += rec.work_at_risk(now) * rec.job.total_gpus
        self.withdraw(rec)
        self.move(rec, JobState.STOPPING)
        self.stopping[rec.job.id] = None
        self.inflight_changes += 1
        rec.stop_reason = reason
        rec.requeue_on_stop = requeue
        return Stop(rec.job.id, reason, requeue, message)

    def release(self, core: Core, rec: JobRecord) -> None:
        """The job holds nothing any more: its GPUs go back and its running indexes forget it."""
        jid = rec.job.id
        if jid in core.ledger.allocs:
            core.ledger.release(jid)
            if rec.started_at is not None:
                rec.service_gpu_s += (core.now - rec.started_at) * rec.job.total_gpus
        if jid in self.noticed or jid in self.stopping:
            self.inflight_changes += 1
        self.noticed.pop(jid, None)
        self.stopping.pop(jid, None)
        self.interactive.pop(jid, None)
        rec.notice = None
