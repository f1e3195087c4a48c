"""Per-scheduler mutable state shared by the cycle phases (one object, many small modules)."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from gpufence.model import mig as migmod
from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Decision, PendingReason, Reason
from gpufence.sched.fairshare import FairShare
from gpufence.sched.jobs import JobRecord, JobState
from gpufence.sched.placement.dispatch import PlacementEngine
from gpufence.sched.queues import PendingQueues
from gpufence.state.ledger import Ledger


@dataclass(slots=True)
class Reservation:
    """GPUs held for the head-of-line gang of a partition from ``start`` on."""

    job_id: str
    pool: str
    start: float
    gpus: tuple[int, ...]
    priority: int


@dataclass(slots=True)
class Nomination:
    """Victims noticed so that ``job_id`` can run; ``pools`` are where it may then go."""

    victims: dict[str, None]
    pools: tuple[str, ...]
    incident: bool


@dataclass
class Counters:
    binds: int = 0
    rejects: int = 0
    preemptions: Counter[str] = field(default_factory=Counter)
    reclaims: Counter[str] = field(default_factory=Counter)
    gpu_seconds_lost: float = 0.0
    requeues: int = 0


@dataclass
class Context:
    cluster: Cluster
    ledger: Ledger
    queues: PendingQueues
    fairshare: FairShare
    engine: PlacementEngine
    records: dict[str, JobRecord] = field(default_factory=dict)
    reservations: dict[str, Reservation] = field(default_factory=dict)
    nominations: dict[str, Nomination] = field(default_factory=dict)
    preempt_times: dict[str, deque[float]] = field(default_factory=dict)
    mig_pending: dict[int, tuple[migmod.MigInstance, ...]] = field(default_factory=dict)
    mig_for: dict[int, str] = field(default_factory=dict)  # GPU -> job it was re-partitioned for
    # why jobs wait: per job (handled on its own) and per shape (its jobs share the reason),
    # each stamped with the cycle that set it so that the newer answer wins
    pending_reason: dict[str, tuple[int, PendingReason]] = field(default_factory=dict)
    shape_reason: dict[int, tuple[int, PendingReason]] = field(default_factory=dict)
    full_reason: dict[str, tuple[int, PendingReason]] = field(default_factory=dict)
    cycle: int = 0
    # MIG pool -> (pool version, idle GPUs that are not being re-partitioned)
    idle_mig: dict[str, tuple[int, list[int]]] = field(default_factory=dict)
    seen: dict[str, tuple[int, int]] = field(default_factory=dict)  # partition -> versions
    protect_after: dict[str, float] = field(default_factory=dict)
    protect_seen: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    counters: Counters = field(default_factory=Counters)
    noticed: dict[str, None] = field(default_factory=dict)  # running jobs with a notice
    interactive: dict[str, None] = field(default_factory=dict)  # running, reclaim-eligible
    idle_heap: list[tuple[float, str]] = field(default_factory=list)  # (idle deadline, job)
    # per donor pool: (start, job) of checkpointable binds in start order, so protection finds
    # the next victim to age past its minimum runtime without scanning every running job
    starts: dict[str, deque[tuple[float, str]]] = field(default_factory=dict)
    # donor pool -> the longest minimum runtime of the policies drawing on it
    donor_min_runtime: dict[str, float] = field(init=False)
    decisions: list[Decision] = field(default_factory=list)
    now: float = 0.0

    def __post_init__(self) -> None:
        self.donor_min_runtime = {}
        for part in self.cluster.partitions.values():
            for pool in part.preemption.from_partitions:
                prev = self.donor_min_runtime.get(pool, 0.0)
                self.donor_min_runtime[pool] = max(prev, part.preemption.min_runtime_s)

    def note_start(self, pool: str, job_id: str) -> None:
        """Remember a checkpointable bind in a donor pool (see ``starts``); entries past every
        policy's minimum runtime are dropped here too, so the deque stays short."""
        longest = self.donor_min_runtime.get(pool)
        if longest is None:
            return
        starts = self.starts.setdefault(pool, deque())
        while starts and starts[0][0] + longest <= self.now:
            starts.popleft()
        starts.append((self.now, job_id))

    def victims_pending(self, nom: Nomination) -> bool:
        """Some victim of ``nom`` still holds its GPUs (noticed, or told to stop). A victim that
        was requeued, ended, or started again elsewhere is no longer waited for."""
        return any(
            v in self.noticed or self.records[v].state is JobState.STOPPING for v in nom.victims
        )

    def why(self, job_id: str) -> PendingReason | None:
        """The newest reason for a pending job: its own, or its shape's."""
        best = self.pending_reason.get(job_id)
        if job_id in self.queues:
            # on a tie the job's own reason wins over its shape's, which wins over the partition's
            for other in (
                self.shape_reason.get(self.queues.shape_of(job_id)),
                self.full_reason.get(self.queues.records[job_id].home),
            ):
                if other is not None and (best is None or other[0] > best[0]):
                    best = other
        return best[1] if best is not None else None

    def set_pending(self, job_id: str, reason: Reason, message: str) -> None:
        self.pending_reason[job_id] = (self.cycle, PendingReason(reason, message))

    def set_shape_pending(self, shape: int, reason: Reason, message: str) -> None:
        self.shape_reason[shape] = (self.cycle, PendingReason(reason, message))
