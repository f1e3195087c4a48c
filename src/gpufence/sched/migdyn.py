"""Dynamic MIG re-partitioning: a GPU's idle instances are re-cut, with a delay, around the ones
jobs run on (never under them); the new layout is built by ``sched/migcut.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufence.model import mig as migmod
from gpufence.model.decisions import Decision, MigReconfigure, Reason
from gpufence.model.events import MigLayoutRead
from gpufence.sched import migcut
from gpufence.sched.context import Core
from gpufence.sched.jobs import JobRecord
from gpufence.sched.migcut import destroyed, unmet_demand
from gpufence.sched.placement.fit import node_admits
from gpufence.sched.placement.mig_room import Size, cut_key, starts_beside
from gpufence.sched.reasons import PendingReasons


@dataclass(slots=True)
class MigWork:
    """Re-partitions in flight and what they were for."""

    pending: dict[int, tuple[migmod.MigInstance, ...]] = field(default_factory=dict)  # GPU -> new
    made_for: dict[int, str] = field(default_factory=dict)  # GPU -> job it was re-partitioned for
    # MIG pool -> (pool version, its GPUs that may be re-cut now)
    usable: dict[str, tuple[int, list[_Gpu]]] = field(default_factory=dict)

    def reconfigured(self, core: Core, gpu: int) -> None:
        """The front end applied the layout asked for on ``gpu``: it is usable again."""
        layout = self.pending.pop(gpu, None)
        if layout is not None:
            core.ledger.set_mig_layout(gpu, layout)
            core.ledger.set_blocked(gpu, False)


def in_flight_offers(core: Core, mig: MigWork, pool: str, profile: str) -> bool:
    return any(
        core.cluster.gpus[g].partition == pool and any(i.profile == profile for i in inst)
        for g, inst in mig.pending.items()
    )


def _order(rec: JobRecord) -> tuple[int, float, str]:
    return (-rec.job.priority, rec.job.submit_time, rec.job.id)


def _kept(core: Core, mig: MigWork, gpu: int, rec: JobRecord) -> bool:
    """The GPU was re-partitioned for a job that still waits and is ``rec`` itself (its layout
    is already what ``rec`` asked for) or ahead of it: taking it would undo that work, and two
    jobs taking each other's GPUs would re-partition them back and forth forever."""
    owner = mig.made_for.get(gpu)
    if owner is None or owner not in core.queues:
        return False
    return owner == rec.job.id or _order(core.queues.records[owner]) < _order(rec)


def repartition_for(
    core: Core, mig: MigWork, reasons: PendingReasons, rec: JobRecord, out: list[Decision]
) -> str | None:
    """Start re-cutting one GPU so that ``rec`` (and the MIG jobs queued behind it) fit: None
    when ``rec`` now waits for a re-cut (a MigReconfigure decision was emitted, or one in flight
    will serve it), else why no re-cut helps ("" where re-cutting does not apply)."""
    pool = rec.home
    part = core.cluster.partitions[pool]
    profile = rec.job.request.mig_profile
    if part.mig is None or not part.mig.dynamic or profile is None:
        return ""
    if in_flight_offers(core, mig, pool, profile):
        reasons.set_job(
            rec.job.id, Reason.RECONFIGURING, f"a GPU is being re-partitioned for {profile}"
        )
        return None
    needed = _needed(core, rec, pool, profile)
    if needed is None:
        return ""
    cut = _choose(core, mig, rec, profile, needed)
    if isinstance(cut, str):
        return cut
    gid, layout = cut
    mig.pending[gid] = tuple(layout)
    mig.made_for[gid] = rec.job.id
    core.ledger.set_blocked(gid, True)
    delay = part.mig.reconfigure_delay_s
    out.append(
        MigReconfigure(
            gpu=gid,
            layout=tuple(f"{i.profile}@{i.start}" for i in layout),
            reason=Reason.MIG_LAYOUT,
            ready_after_s=delay,
            message=_cut_message(core, gid, profile),
        )
    )
    reasons.set_job(rec.job.id, Reason.RECONFIGURING, f"GPU {gid} re-partitioning ({delay:g} s)")
    return None


def _needed(core: Core, rec: JobRecord, pool: str, profile: str) -> int | None:
    """Instances of ``profile`` one re-cut GPU must add for the whole job to fit: the replicas
    that free instances elsewhere do not cover (at least one: a job that waits beside free
    instances lacks CPU or memory there, and a GPU on another node may serve it); None when one
    GPU cannot add that many."""
    led = core.ledger
    free_now = sum(n for g, n in led.mig_free.get((pool, profile), {}).items() if led.gpu_usable(g))
    needed = max(1, rec.job.replicas - free_now)
    return needed if needed <= migmod.MAX_INSTANCES else None


@dataclass(frozen=True, slots=True)
class _Gpu:
    gid: int
    node: int
    model: str
    running: tuple[migmod.MigInstance, ...]  # instances with a job on them: they stay
    idle: tuple[migmod.MigInstance, ...]
    jobs: tuple[str, ...]  # the jobs on ``running``, in its order


def _usable(core: Core, mig: MigWork, pool: str) -> list[_Gpu]:
    """The pool's GPUs that may be re-cut now (usable, no re-cut in flight), cached until the
    ledger changes on the pool's nodes (a GPU enters or leaves ``pending`` only together with a
    ledger change on it)."""
    led = core.ledger
    version = led.pool_version[pool]
    cached = mig.usable.get(pool)
    if cached is not None and cached[0] == version:
        return cached[1]
    gpus: list[_Gpu] = []
    for g in core.cluster.partition_gpus[pool]:
        if g in mig.pending or not led.gpu_usable(g):
            continue
        st = led.mig[g]
        model = core.cluster.gpu_type_of(g).mig_model
        assert model is not None
        held = sorted(
            ((i, o) for i, o in zip(st.instances, st.occupant, strict=True) if o is not None),
            key=lambda io: (io[0].start, io[0].profile),
        )
        running = tuple(i for i, _ in held)
        idle = tuple(i for i, o in zip(st.instances, st.occupant, strict=True) if o is None)
        jobs = tuple(o for _, o in held)
        gpus.append(_Gpu(g, core.cluster.gpus[g].node, model, running, idle, jobs))
    mig.usable[pool] = (version, gpus)
    return gpus


def _choose(
    core: Core, mig: MigWork, rec: JobRecord, profile: str, needed: int
) -> tuple[int, list[migmod.MigInstance]] | str:
    """The GPU to re-cut and its new layout, or why there is none. GPUs are ranked like
    placement (``mig_room.cut_key``: least room that still takes the profile, beside the running
    instances alone), then by the idle instances the cut destroys."""
    led = core.ledger
    ranked: list[tuple[_Rank, _Gpu]] = []
    blocked: list[_Gpu] = []
    for gpu in _usable(core, mig, rec.home):
        if not node_admits(led, rec.job, gpu.node, needed) or _kept(core, mig, gpu.gid, rec):
            continue
        starts = starts_beside(gpu.model, gpu.running, profile)
        if starts:
            ranked.append((min(_rank(gpu, profile, s) for s in starts), gpu))
        else:
            blocked.append(gpu)
    ranked.sort(key=lambda kg: kg[0])
    demand: list[str] | None = None
    for _, gpu in ranked[:_TRIES]:
        if demand is None:
            demand = unmet_demand(core, rec.home, rec)
        layout = migcut.full_layout(gpu.model, gpu.running, gpu.idle, [profile] * needed, demand)
        if layout is not None:
            return gpu.gid, layout
    return _why_none(core, mig, rec.home, profile, blocked)


_Rank = tuple[Size, int, tuple[Size, Size, int], int, int]


def _rank(gpu: _Gpu, profile: str, start: int) -> _Rank:
    """Best fit by room first, then the fewest idle instances destroyed, then what is left."""
    key = cut_key(gpu.model, gpu.running, profile, start)
    lost = destroyed(migmod.profiles_for(gpu.model), gpu.idle, migmod.MigInstance(profile, start))
    return key[0], lost, key, gpu.gid, start


_TRIES = 8  # GPUs tried for a gang's instances (the best-ranked one almost always takes them)
_SHOWN = 3  # blocked GPUs named in a pending reason


def _why_none(core: Core, mig: MigWork, pool: str, profile: str, blocked: list[_Gpu]) -> str:
    """Which GPUs block the profile: at each legal start, the jobs whose instances are there."""
    parts = [_blocking(g, profile) for g in blocked[:_SHOWN]]
    if len(blocked) > _SHOWN:
        parts.append(f"{len(blocked) - _SHOWN} more GPUs alike")
    recut = sorted(g for g in mig.pending if core.cluster.gpus[g].partition == pool)
    if recut:
        parts.append("being re-cut: GPU " + ", ".join(str(g) for g in recut))
    where = f" ({'; '.join(parts)})" if parts else ""
    return f"no GPU in {pool} can be re-cut for {profile} beside its running instances{where}"


def _blocking(gpu: _Gpu, profile: str) -> str:
    profiles = migmod.profiles_for(gpu.model)
    p = profiles[profile]
    spans = [migmod.span_mask(i.start, profiles[i.profile].mem_slices) for i in gpu.running]
    out: list[str] = []
    for s in p.starts:
        span = migmod.span_mask(s, p.mem_slices)
        who = [j for m, j in zip(spans, gpu.jobs, strict=True) if m & span]
        # no overlap: the per-GPU caps (instances of the profile, 7 in all) are what block it
        out.append(f"@{s} under {', '.join(who)}" if who else f"@{s} over the per-GPU limits")
    return f"GPU {gpu.gid}: " + ", ".join(out)


def _cut_message(core: Core, gid: int, profile: str) -> str:
    st = core.ledger.mig[gid]
    if not st.busy():
        return f"re-partition idle GPU {gid} for pending {profile} demand"
    running = sorted(
        (i for i, o in zip(st.instances, st.occupant, strict=True) if o is not None),
        key=lambda i: i.start,
    )
    kept = ", ".join(f"{i.profile}@{i.start}" for i in running)
    return f"re-partition GPU {gid} around its running {kept} for pending {profile} demand"


def _read_layout(entries: tuple[str, ...]) -> list[migmod.MigInstance] | None:
    out: list[migmod.MigInstance] = []
    for e in entries:
        name, _, start = e.rpartition("@")
        if not name or not start.isdigit():
            return None
        out.append(migmod.MigInstance(name, int(start)))
    return out


def apply_layout_read(core: Core, mig: MigWork, ev: MigLayoutRead) -> None:
    """A GPU's MIG layout as the front end read it off the device (at start-up, or after a
    re-partition failed part-way). It replaces what the ledger holds; a re-partition in flight
    on the GPU is dropped, so the job it was for is placed again this very cycle. A layout the
    hardware could not have (or one without an instance a job runs on) is not taken: the GPU is
    taken out of placement instead, as it is when ``usable`` is False."""
    led = core.ledger
    gid = ev.gpu
    if not 0 <= gid < len(core.cluster.gpus):
        return
    mig.pending.pop(gid, None)
    mig.made_for.pop(gid, None)
    usable = ev.usable
    st = led.mig.get(gid)
    model = core.cluster.gpu_type_of(gid).mig_model
    if st is not None and model is not None and usable:
        layout = _read_layout(ev.layout)
        profiles = migmod.profiles_for(model)
        if layout is None or migmod.validate_layout(profiles, layout):
            usable = False
        elif layout != st.instances:
            running = {i for i, o in zip(st.instances, st.occupant, strict=True) if o}
            if running <= set(layout):  # e.g. a re-cut around them that failed part-way
                led.set_mig_layout(gid, layout)
            else:
                usable = False  # an instance a job runs on is gone: never guess where it went
    if (gid in led.blocked) == usable:
        led.set_blocked(gid, not usable)
