"""What a dynamic-MIG GPU is re-cut to: a full, valid layout for the waiting mix.

A re-cut keeps the instances with a job on them where they are (the hardware destroys and creates
only idle ones), puts the instances the job needs where they leave the most room
(``placement/mig_room.py``), then the demand queued behind it that no free instance serves, then
keeps the old idle instances that still fit (a re-cut changes no more than it must), and cuts what
is left into the smallest profile: no slice is left uncut, and idle small instances never stand in
the way of a large profile later, since they can be re-cut around the running ones again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpufence.model import mig as migmod
from gpufence.model.job import RequestKind
from gpufence.sched.context import Core
from gpufence.sched.jobs import JobRecord
from gpufence.sched.placement.mig_room import cut_key, fixed_of


def unmet_demand(core: Core, pool: str, rec: JobRecord) -> list[str]:
    """Profiles of the MIG jobs queued in ``pool`` (other than ``rec``), in queue order, one per
    replica, that no free instance in the pool serves; at most a GPU's worth."""
    led = core.ledger
    spare: dict[str, int] = {}
    for (p, prof), per in led.mig_free.items():
        if p == pool:
            spare[prof] = sum(n for g, n in per.items() if led.gpu_usable(g))
    out: list[str] = []
    for r in core.queues.of_home(pool):
        req = r.job.request
        if req.kind is not RequestKind.MIG or r.job.id == rec.job.id or req.mig_profile is None:
            continue
        for _ in range(r.job.replicas):
            if spare.get(req.mig_profile, 0) > 0:
                spare[req.mig_profile] -= 1
            else:
                out.append(req.mig_profile)
        if len(out) >= migmod.MAX_INSTANCES:
            break
    return out


def _overlaps(
    profiles: Mapping[str, migmod.MigProfile], a: migmod.MigInstance, b: migmod.MigInstance
) -> bool:
    return bool(
        migmod.span_mask(a.start, profiles[a.profile].mem_slices)
        & migmod.span_mask(b.start, profiles[b.profile].mem_slices)
    )


def destroyed(
    profiles: Mapping[str, migmod.MigProfile],
    idle: Sequence[migmod.MigInstance],
    new: migmod.MigInstance,
) -> int:
    """Idle instances of the old layout that ``new`` would destroy."""
    return sum(_overlaps(profiles, new, i) for i in idle)


def best_place(
    model: str, layout: Sequence[migmod.MigInstance], idle: Sequence[migmod.MigInstance], name: str
) -> int | None:
    """The start for ``name`` next to ``layout``: fewest old idle instances destroyed, then the
    most room left (``cut_key``); None when it does not fit."""
    profiles = migmod.profiles_for(model)
    fixed = fixed_of(layout)
    best: tuple[int, tuple[object, ...], int] | None = None
    for s in migmod.feasible_starts(profiles, layout, name):
        inst = migmod.MigInstance(name, s)
        key = (destroyed(profiles, idle, inst), cut_key(model, fixed, name, s), s)
        if best is None or key < best:
            best = key
    return None if best is None else best[2]


def _smallest(profiles: Mapping[str, migmod.MigProfile]) -> str:
    """The plain 1g profile (GI profile 19): the most instances out of what is left."""
    return min(
        (n for n, p in profiles.items() if not p.media_ext),
        key=lambda n: (profiles[n].mem_slices, profiles[n].compute_slices, n),
    )


def full_layout(
    model: str,
    running: Sequence[migmod.MigInstance],
    idle: Sequence[migmod.MigInstance],
    wanted: Sequence[str],
    demand: Sequence[str],
) -> list[migmod.MigInstance] | None:
    """The new layout (see the module docstring); None when ``wanted`` does not all fit."""
    profiles = migmod.profiles_for(model)
    layout = list(running)

    def add(name: str) -> bool:
        if len(layout) >= migmod.MAX_INSTANCES:
            return False
        s = best_place(model, layout, idle, name)
        if s is not None:
            layout.append(migmod.MigInstance(name, s))
        return s is not None

    if not all(add(name) for name in wanted):
        return None
    full: set[str] = set()  # a profile that no longer fits never fits again: the layout grows
    for name in demand:
        if name in profiles and name not in full and not add(name):
            full.add(name)
    for inst in sorted(idle, key=lambda i: i.start):
        if migmod.can_place(profiles, layout, inst.profile, inst.start):
            layout.append(inst)
    small = _smallest(profiles)
    while add(small):
        pass
    return sorted(layout, key=lambda i: (i.start, i.profile))
