"""The one explicit registry of scheduling plugins (no import side effects).

Each extension point is a typed Protocol and a dict from the name a cluster spec uses to a
factory; the spec's lists of valid names are these dicts' keys (``names``), so adding a policy
is one module plus one line here.

  queue order   QUEUE_ORDERS   sched/ordering.QueueOrder      partition ``queue_order:``
  placement     PLACERS        PlacementMode (below)          per sharing mode: its placer
                                                              (sched/placement/fit.Placer),
                                                              whether gangs reserve, re-cuts
  score         SCORERS        sched/placement/scoring.Scorer fractional ``placement:``
  admission     ADMISSION      sched/admission.Admission      run in order on every job placed
  reservation   RESERVATIONS   sched/context.ReservationRule  DEFAULT_RESERVATION (who
                                                              reserves, who may backfill; no
                                                              spec key names one yet)

Fixed parts of the cycle that are not (yet) pluggable: post-filter = protection
(sched/protect.py), permit = gangs all-or-nothing (placers return a whole gang or nothing),
reclaim of idle sessions (sched/reclaim.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, TypeVar

from gpufence.model.partition import Partition, SharingMode
from gpufence.sched.admission import Admission, CohortQuota
from gpufence.sched.las import LeastAttainedService
from gpufence.sched.ordering import PriorityFairShare, QueueOrder
from gpufence.sched.placement.fit import NotPlaced, Placer
from gpufence.sched.placement.mig_instances import MigPlacer
from gpufence.sched.placement.timeslice import TimeSlicePlacer
from gpufence.sched.placement.whole import WholeGpuPlacer

if TYPE_CHECKING:
    from gpufence.sched.context import ReservationRule
    from gpufence.sched.jobs import JobRecord
    from gpufence.sched.placement.scoring import Scorer
    from gpufence.sched.placing import Placing

# The fractional placer and the scorers need numpy; they are imported when a scheduler makes
# one, not when the spec asks for the valid names: `gpufence validate` and the other client
# verbs run on the base install, which has no numpy (README, "What to install").


def _scorer(cls: str, seed: int) -> Scorer:
    from gpufence.sched.placement import scoring

    if cls == "RandomFit":
        return scoring.RandomFit(seed)
    made: Scorer = getattr(scoring, cls)(seed=seed)
    return made


def _fractional(part: Partition, seed: int) -> Placer:
    from gpufence.sched.placement.fractional import FractionalPlacer

    return FractionalPlacer(make_scorer(part.placement, seed))


QUEUE_ORDERS: dict[str, Callable[[], QueueOrder]] = {
    "fair-share": PriorityFairShare,
    "las": LeastAttainedService,
}

SCORERS: dict[str, Callable[[int], Scorer]] = {
    "best-fit": lambda seed: _scorer("BestFit", seed),
    "fgd": lambda seed: _scorer("FragmentationGradient", seed),
    "fence-pack": lambda seed: _scorer("FencePack", seed),
    "random": lambda seed: _scorer("RandomFit", seed),
}


@dataclass(frozen=True, slots=True)
class PlacementMode:
    """What a sharing mode brings to a partition's walk (sched/partition_walk.py)."""

    # a placer for a partition (and the seed of its scorer, where it has one)
    placer: Callable[[Partition, int], Placer]
    # gangs that do not fit reserve whole GPUs (the reservation rule says which), held from
    # the jobs behind them but for backfill
    reserves: bool = False
    # when a job does not fit for capacity (why: the NotPlaced): make room that no layout
    # offers yet. A str: it started that, and the job waits for it with that reason; a
    # NotPlaced: why the job waits (why no room can be made added where that says more)
    recut: Callable[[Placing, JobRecord, NotPlaced], str | NotPlaced] | None = None


@cache
def _repartition_for() -> Callable[..., str | None]:
    # (the core: numpy, see above; an import statement on every call would cost 0.8 us, and
    # the walk asks once per MIG shape that does not fit)
    from gpufence.sched.migdyn import repartition_for

    return repartition_for


def _mig_recut(st: Placing, rec: JobRecord, r: NotPlaced) -> str | NotPlaced:
    no_cut = _repartition_for()(st.core, st.mig, st.reasons, rec, st.out)
    if no_cut is None:  # a re-cut serves it: one per shape per cycle, the next with the next
        return "waiting for a MIG re-partition"
    return NotPlaced(r.reason, f"{r.message}; {no_cut}") if no_cut else r


PLACERS: dict[SharingMode, PlacementMode] = {
    SharingMode.EXCLUSIVE: PlacementMode(lambda part, seed: WholeGpuPlacer(), reserves=True),
    SharingMode.MIG: PlacementMode(lambda part, seed: MigPlacer(), recut=_mig_recut),
    SharingMode.FRACTIONAL: PlacementMode(_fractional),
    SharingMode.TIME_SLICE: PlacementMode(lambda part, seed: TimeSlicePlacer()),
}

ADMISSION: dict[str, Callable[[], Admission]] = {
    "quota": CohortQuota,
}


def _easy() -> ReservationRule:
    from gpufence.sched.backfill import EasyBackfill  # (the core: numpy, see above)

    return EasyBackfill()


RESERVATIONS: dict[str, Callable[[], ReservationRule]] = {
    "easy": _easy,
}
DEFAULT_RESERVATION = "easy"

_KINDS: dict[str, Mapping[str, object]] = {
    "queue order": QUEUE_ORDERS,
    "placement policy": SCORERS,
}
T = TypeVar("T")


def names(kind: str) -> tuple[str, ...]:
    """The valid names of one kind of named plugin ("queue order", "placement policy"), in
    registry order: what the cluster spec accepts."""
    return tuple(_KINDS[kind])


def _lookup(table: dict[str, T], kind: str, name: str) -> T:
    try:
        return table[name]
    except KeyError:
        known = ", ".join(sorted(table))
        raise ValueError(f"unknown {kind} '{name}' (known: {known})") from None


def make_scorer(name: str, seed: int) -> Scorer:
    return _lookup(SCORERS, "placement policy", name)(seed)


def make_queue_order(name: str) -> QueueOrder:
    return _lookup(QUEUE_ORDERS, "queue order", name)()


def make_placer(part: Partition, seed: int) -> Placer:
    return PLACERS[part.sharing].placer(part, seed)


def make_reservations(name: str = DEFAULT_RESERVATION) -> ReservationRule:
    return _lookup(RESERVATIONS, "reservation rule", name)()


def admission_rules() -> tuple[Admission, ...]:
    return tuple(factory() for factory in ADMISSION.values())
