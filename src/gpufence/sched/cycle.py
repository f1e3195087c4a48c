"""One scheduling cycle, as numbered phases. Each phase is a function of the state it owns and
returns its decisions; the pieces of state are named in ``SchedulerState``:

  1. apply events        sched/apply.py     submits, ends, stops, acks, activity, nodes, MIG;
                         sched/drains.py    drains and maintenance windows (windows that began
                                            or ended are applied first)
  2. expire deadlines    sched/expiry.py    time limits; a notice past its deadline -> a stop
  3. warn idle           sched/reclaim.py   idle interactive sessions get a warning
  4. gates               sched/gates.py     held / dependent / array-capped jobs join their
                                            queues, or are cancelled (apply.open_gates)
  5. place partitions    sched/place.py     nominated jobs first, then each partition's walk
                                            (partition_walk.py: a decision per job)
  6. lend                sched/lend.py      idle capacity of lending partitions to their borrowers
  7. reclaim / protect   sched/protect.py   lent capacity back; budgeted incident preemption
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpufence.model.decisions import Decision
from gpufence.model.events import Event
from gpufence.sched.apply import apply_events, open_gates
from gpufence.sched.book import JobBook
from gpufence.sched.context import Claims, Core
from gpufence.sched.drains import advance as advance_windows
from gpufence.sched.expiry import expire_limits, expire_notices
from gpufence.sched.gates import Gates
from gpufence.sched.lend import lend
from gpufence.sched.migdefrag_stop import defrag
from gpufence.sched.migdyn import MigWork, release_drains
from gpufence.sched.place import PlaceMemo, Placing, place_partitions, release_holds
from gpufence.sched.protect import Protecting, ProtectionState, protect
from gpufence.sched.reasons import PendingReasons
from gpufence.sched.reclaim import warn_idle


@dataclass(slots=True)
class SchedulerState:
    core: Core  # cluster, ledger, queues, fair share, placement engine, clock
    book: JobBook  # every job, its lifecycle, the indexes over running jobs, counters
    claims: Claims  # reservations and nominations
    reasons: PendingReasons  # why pending jobs wait
    mig: MigWork  # MIG re-partitions in flight
    protection: ProtectionState  # incident budget windows and protection's retry times
    memo: PlaceMemo  # what placement saw last, to skip partitions where nothing changed
    gates: Gates = field(default_factory=Gates)  # held / dependent / capped jobs wait here
    made: list[Decision] = field(default_factory=list)  # the last (or current) cycle's decisions


def run_cycle(s: SchedulerState, events: Iterable[Event], now: float) -> list[Decision]:
    core = s.core
    core.fairshare.advance(now, core.ledger)
    core.now = now
    advance_windows(core)  # maintenance windows that began or ended close or open their nodes
    # this cycle's decisions, as each phase makes them: what a front end keeps (``made``) when a
    # phase raises after earlier ones changed the state
    out = s.made = []
    # 1. apply events
    apply_events(core, s.book, s.claims, s.reasons, s.mig, s.gates, events, out, s.protection)
    # 2. expire time limits and notices
    out += expire_limits(s.book, now)
    out += expire_notices(s.book, now)
    # 3. warn idle
    out += warn_idle(core.cluster, s.book, now)
    # 4. gates: jobs that may run now join their queues (before placement sees the queues)
    out += open_gates(core, s.book, s.claims, s.reasons, s.gates)
    release_drains(core, s.mig)  # a GPU drained for a job that no longer waits takes jobs again
    s.reasons.cycle += 1
    # 5. place per partition (the GPUs victims are freeing stay held for the jobs they are
    #    freed for through placement and lending)
    failed, held = place_partitions(Placing(core, s.book, s.claims, s.reasons, s.mig, out), s.memo)
    # 6. lend
    lend(Placing(core, s.book, s.claims, s.reasons, s.mig, out), failed)
    release_holds(core.ledger, held)
    # 7. reclaim / protect
    protect(Protecting(core, s.book, s.claims, s.reasons, s.protection, out), failed)
    out += defrag(core, s.book, s.mig, s.reasons)  # MIG drains cleared by stops (migdefrag_stop)
    return out
