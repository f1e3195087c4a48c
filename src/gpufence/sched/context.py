"""The narrow pieces of scheduler state that the cycle's phases share, and who owns what.

Core      the cluster, the ledger, the pending queues, fair share, the placement engine and
          the clock: what every phase reads (changes go through the ledger and queue methods)
Claims    what waiting jobs hold on to across cycles: the head-of-line gang's reservation per
          partition, and the nominations of jobs that noticed victims to run
(elsewhere) the job book (sched/book.py), pending reasons (sched/reasons.py), protection's
          budget and retry state (sched/protect.py), MIG re-partitions (sched/migdyn.py)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gpufence.model.cluster import Cluster
from gpufence.sched.admission import Admission
from gpufence.sched.fairshare import FairShare
from gpufence.sched.placement.dispatch import PlacementEngine
from gpufence.sched.queues import PendingQueues
from gpufence.state.closures import NodeClosures
from gpufence.state.ledger import Ledger

if TYPE_CHECKING:
    from gpufence.model.job import Job
    from gpufence.sched.jobs import JobRecord


@dataclass(slots=True)
class Core:
    """What every phase reads; ``now`` is the time of this step."""

    cluster: Cluster
    ledger: Ledger
    queues: PendingQueues
    fairshare: FairShare
    engine: PlacementEngine
    closures: NodeClosures  # drained nodes and maintenance windows (the engine's too)
    reservations: ReservationRule  # who reserves, and who may backfill (sched/backfill.py)
    admission: tuple[Admission, ...] = ()  # rules every job passes before it is placed
    tenants: frozenset[str] | None = None  # who queue labels may name (SchedulerConfig.tenants)
    now: float = 0.0
    # queue -> milli-GPU it ran when its quota was lowered below that (sched/retune.py): work
    # already running is never stopped for a quota, so the invariants accept up to this much
    over_quota: dict[str, int] = field(default_factory=dict)

    def share(self, queue: str) -> float:
        """The queue's weighted fair share now (the walk's order among equal priorities)."""
        return self.fairshare.share(queue, self.ledger)


@dataclass(slots=True)
class Reservation:
    """GPUs held for the head-of-line gang of a partition from ``start`` on."""

    job_id: str
    pool: str
    start: float
    gpus: tuple[int, ...]
    priority: int
    queue: str  # the gang's queue: jobs of queues ahead of it by fair share may pass
    # (expected end, job) of the running jobs whose GPUs the start counts on, by end: one
    # still running past its end proves the start wrong (``overrun``)
    counted: tuple[tuple[float, str], ...] = ()
    overran: str = ""
    """Running jobs past their estimates that hold GPUs the gang needs, named for its reason."""

    def overrun(self, now: float, running: Callable[[str], bool]) -> bool:
        """Some job the start counts on is still running past its expected end."""
        for end, job_id in self.counted:
            if end >= now:
                return False
            if running(job_id):
                return True
        return False


class ReservationRule(Protocol):
    """Reservation and backfill (registered in ``sched/registry.py``, ``RESERVATIONS``): which
    job that does not fit holds its partition's one reservation, where and from when, and
    which job may bind on the reserved GPUs before the gang starts."""

    def reservable(self, core: Core, job: Job, pool: str) -> bool:
        """May ``job``, not fitting in ``pool`` now, reserve there?"""
        ...

    def reserve(
        self, core: Core, records: Mapping[str, JobRecord], rec: JobRecord, pool: str
    ) -> Reservation | None:
        """The reservation for ``rec`` in ``pool`` (None: it can never be placed there);
        ``records``: every job's record (the running jobs' expected ends)."""
        ...

    def may_backfill(self, core: Core, job: Job, res: Reservation) -> bool:
        """May ``job`` (not ahead of the gang) take GPUs held for ``res``?"""
        ...


@dataclass(slots=True)
class Nomination:
    """Victims noticed so that ``job_id`` can run; ``pools`` are where it may then go."""

    victims: dict[str, None]
    pools: tuple[str, ...]
    incident: bool


@dataclass(slots=True)
class Claims:
    """Capacity waiting jobs have a claim on: reservations (partition -> the gang's) and
    nominations (job -> the victims it waits for)."""

    reservations: dict[str, Reservation] = field(default_factory=dict)
    nominations: dict[str, Nomination] = field(default_factory=dict)
    # job -> the GPUs a waiting nomination will get (hold_for_nominations keeps the plan while
    # it still holds)
    plans: dict[str, list[int]] = field(default_factory=dict)
