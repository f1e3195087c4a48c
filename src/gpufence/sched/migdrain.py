"""MIG defragmentation by attrition: one GPU per pool drained for a large profile.

When a MIG job's profile fits on no GPU of a dynamic pool beside the running instances, although
the pool has that many memory slices free (they are scattered: fragmentation, not a full pool),
one GPU is drained for it: it takes no new job (the ledger blocks it) while the instances in the
way end by themselves, then it is re-cut for the job (``migdyn``). Nothing is stopped, so no
preemption budget is spent; the cost is the drained GPU's idle slices meanwhile, bounded to one
GPU per pool. The GPU is the one where the fewest running instances stand in the profile's way.
A drain ends when its job starts, leaves the queue, or the GPU is read anew.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufence.model import mig as migmod
from gpufence.sched.context import Core
from gpufence.sched.jobs import JobRecord
from gpufence.sched.migindex import PoolIndex, Sig, running_jobs
from gpufence.sched.placement.fit import node_admits
from gpufence.sched.placement.mig_room import starts_beside


@dataclass(frozen=True, slots=True)
class Drain:
    job_id: str
    gpu: int
    profile: str


def scattered_room(core: Core, pool: str, profile: str) -> bool:
    """The profile spans several slices (a 1g job is helped by any instance that ends, a drain
    would only idle a GPU) and the pool's usable GPUs have that many memory slices free."""
    led = core.ledger
    free = 0
    need = 0
    for g in core.cluster.partition_gpus[pool]:
        if not led.gpu_usable(g):
            continue
        model = core.cluster.gpu_type_of(g).mig_model
        assert model is not None
        profiles = migmod.profiles_for(model)
        if profiles[profile].compute_slices < 2:
            return False
        need = profiles[profile].mem_slices
        st = led.mig[g]
        held = [i for i, o in zip(st.instances, st.occupant, strict=True) if o is not None]
        free += migmod.MEM_SLICES - bin(migmod.occupied_mask(profiles, held)).count("1")
        if free >= need:
            return True
    return False


def _blockers(model: str, running: tuple[migmod.MigInstance, ...], profile: str) -> list[int]:
    """Indexes into ``running`` of the instances over the profile's least-blocked legal start."""
    profiles = migmod.profiles_for(model)
    p = profiles[profile]
    spans = [migmod.span_mask(i.start, profiles[i.profile].mem_slices) for i in running]
    per_start = [
        [k for k, m in enumerate(spans) if m & migmod.span_mask(s, p.mem_slices)] for s in p.starts
    ]
    return min(per_start, key=len)


def _in_the_way(sig: Sig, profile: str) -> tuple[int, int]:
    """(running instances in the profile's way, running instances in all)."""
    model, running, _ = sig
    return len(_blockers(model, running, profile)), len(running)


def start_drain(core: Core, ix: PoolIndex, rec: JobRecord, profile: str) -> Drain | None:
    """Pick the GPU to drain for ``rec`` (see the module docstring) and block it."""
    best: tuple[tuple[int, int], int] | None = None
    for sid, gids in ix.groups.items():
        cost = _in_the_way(ix.sigs[sid], profile)
        if cost[0] == 0:  # it fits there now: not re-cut for another reason (kept for a job)
            continue
        for g in gids:
            if best is not None and (cost, g) >= best:
                break
            if node_admits(core.ledger, rec.job, core.cluster.gpus[g].node):
                best = (cost, g)
                break
    if best is None:
        return None
    core.ledger.set_blocked(best[1], True)
    return Drain(rec.job.id, best[1], profile)


def drained(core: Core, d: Drain) -> bool:
    """Nothing running on the GPU stands in the profile's way any more. (Asked every cycle
    the drain's job is walked: kept in the GPU's memo, emptied when its instances or their
    jobs change -- what the answer follows from.)"""
    memo = core.ledger.mig[d.gpu].memo
    key = ("drained", d.profile)
    done = memo.get(key)
    if not isinstance(done, bool):
        model = core.cluster.gpu_type_of(d.gpu).mig_model
        assert model is not None
        running = tuple(i for i, _ in running_jobs(core, d.gpu))
        done = memo[key] = bool(starts_beside(model, running, d.profile))
    return done


def waiting_for(core: Core, d: Drain) -> str:
    """The drained job's pending reason (kept in the GPU's memo like ``drained``)."""
    memo = core.ledger.mig[d.gpu].memo
    key = ("drain waits", d.profile)
    said = memo.get(key)
    if isinstance(said, str):
        return said
    model = core.cluster.gpu_type_of(d.gpu).mig_model
    assert model is not None
    held = running_jobs(core, d.gpu)
    way = _blockers(model, tuple(i for i, _ in held), d.profile)
    jobs = ", ".join(held[k][1] for k in way)
    said = memo[key] = (
        f"GPU {d.gpu} is drained for {d.profile} (it takes no new job): waiting for {jobs} to end"
    )
    return said


def end_drain(core: Core, d: Drain) -> None:
    if d.gpu in core.ledger.blocked:
        core.ledger.set_blocked(d.gpu, False)
