"""How much room a dynamic-MIG GPU keeps for large profiles, given the instances that stay.

On a dynamic partition only the instances with a job on them are fixed: the idle ones can be
destroyed and the space re-cut (``sched/migdyn.py``). So what a GPU can still take is decided by
its running instances alone, under the hardware's placement rules (``model/mig.py``: legal starts,
memory-slice overlap, per-profile caps, at most 7 instances). Placement and re-cuts both choose
where a new instance goes by what it leaves: the fragmentation-aware rule, instead of smallest-fit.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from gpufence.model import mig as migmod

Size = tuple[int, int]  # (compute slices, memory slices) of a profile; (0, 0): nothing fits
CutKey = tuple[Size, Size, int]


@lru_cache(maxsize=16384)
def room(model: str, fixed: tuple[migmod.MigInstance, ...]) -> tuple[Size, int]:
    """The largest profile still placeable next to ``fixed`` (sorted by start) and how many
    (profile, start) pairs are placeable: more means less fragmented."""
    profiles = migmod.profiles_for(model)
    largest: Size = (0, 0)
    options = 0
    for name, p in profiles.items():
        n = len(migmod.feasible_starts(profiles, fixed, name))
        options += n
        if n:
            largest = max(largest, (p.compute_slices, p.mem_slices))
    return largest, options


def fixed_of(instances: Iterable[migmod.MigInstance]) -> tuple[migmod.MigInstance, ...]:
    """The cache key of a set of instances (order does not matter to the hardware)."""
    return tuple(sorted(instances, key=lambda i: (i.start, i.profile)))


def size_of(model: str, profile: str) -> Size:
    p = migmod.profile(model, profile)
    return (p.compute_slices, p.mem_slices)


@lru_cache(maxsize=16384)
def cut_key(model: str, fixed: tuple[migmod.MigInstance, ...], profile: str, start: int) -> CutKey:
    """Sort key of putting ``profile@start`` beside ``fixed`` (smaller is better): best fit by
    the GPU's room (the GPU with the least room that still takes it, so GPUs with room for a
    large profile keep it), then the start that leaves the largest profile placeable, then the
    most placement options left."""
    before, _ = room(model, fixed)
    after, options = room(model, fixed_of((*fixed, migmod.MigInstance(profile, start))))
    return before, (-after[0], -after[1]), -options


@lru_cache(maxsize=16384)
def starts_beside(
    model: str, fixed: tuple[migmod.MigInstance, ...], profile: str
) -> tuple[int, ...]:
    """Where ``profile`` could be created next to ``fixed`` alone (all other instances idle)."""
    return migmod.feasible_starts(migmod.profiles_for(model), fixed, profile)
