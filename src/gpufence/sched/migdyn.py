"""Dynamic MIG re-partitioning: only on an idle GPU, with a delay, never under a running job."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from gpufence.model import mig as migmod
from gpufence.model.decisions import Decision, MigReconfigure, Reason
from gpufence.model.events import MigLayoutRead
from gpufence.model.job import RequestKind
from gpufence.sched.context import Core
from gpufence.sched.jobs import JobRecord
from gpufence.sched.placement.fit import node_admits
from gpufence.sched.reasons import PendingReasons


@dataclass(slots=True)
class MigWork:
    """Re-partitions in flight and what they were for."""

    pending: dict[int, tuple[migmod.MigInstance, ...]] = field(default_factory=dict)  # GPU -> new
    made_for: dict[int, str] = field(default_factory=dict)  # GPU -> job it was re-partitioned for
    # MIG pool -> (pool version, idle GPUs that are not being re-partitioned)
    idle: dict[str, tuple[int, list[int]]] = field(default_factory=dict)

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
) -> bool:
    """Start re-partitioning one idle GPU so that ``rec`` (and the MIG jobs queued behind it)
    fit. True when a MigReconfigure decision was emitted or one in flight will serve it."""
    pool = rec.home
    part = core.cluster.partitions[pool]
    profile = rec.job.request.mig_profile
    if part.mig is None or not part.mig.dynamic or profile is None:
        return False
    if in_flight_offers(core, mig, pool, profile):
        reasons.set_job(
            rec.job.id, Reason.RECONFIGURING, f"a GPU is being re-partitioned for {profile}"
        )
        return True
    led = core.ledger
    job = rec.job
    # one new GPU gives at most one more instance per replica's node: re-partitioning only
    # helps a gang whose other replicas already have free instances, and only on a node that
    # has CPU and memory for a replica (else the GPU would be re-cut again and again for nothing)
    free_now = sum(n for g, n in led.mig_free.get((pool, profile), {}).items() if led.gpu_usable(g))
    if job.replicas - free_now > 1:
        return False
    version = led.pool_version[pool]
    cached = mig.idle.get(pool)
    if cached is not None and cached[0] == version:
        idle_any = cached[1]  # nothing on the pool's nodes changed since the last look
    else:
        # (a GPU enters or leaves mig_pending only together with a ledger change on it)
        idle_any = [
            g
            for g in core.cluster.partition_gpus[pool]
            if led.mig[g].busy_count == 0 and g not in mig.pending and led.gpu_usable(g)
        ]
        mig.idle[pool] = (version, idle_any)
    if not idle_any:
        return False
    idle = [
        g
        for g in idle_any
        if node_admits(led, job, core.cluster.gpus[g].node) and not _kept(core, mig, g, rec)
    ]
    if not idle:
        return False
    # the idle GPU whose current layout is least useful: fewest instances of the wanted profile
    gid = min(idle, key=lambda g: (sum(i.profile == profile for i in led.mig[g].instances), g))
    model = core.cluster.gpu_type_of(gid).mig_model
    assert model is not None
    profiles = migmod.profiles_for(model)
    # the new layout serves this job first, then the MIG demand queued behind it, in order
    demand = (
        r.job.request.mig_profile or ""
        for r in core.queues.of_home(pool)
        if r.job.request.kind is RequestKind.MIG and r.job.id != rec.job.id
    )
    layout: list[migmod.MigInstance] = []
    # a profile that no longer fits never fits again (the layout only grows): skip it, and stop
    # once no profile fits
    full: set[str] = set()
    for name in itertools.chain((profile,), demand):
        if name not in profiles or name in full:
            continue
        start = migmod.best_start(profiles, layout, name)
        if start is not None:
            layout.append(migmod.MigInstance(name, start))
        else:
            full.add(name)
            if len(full) == len(profiles):
                break
        if len(layout) >= migmod.MAX_INSTANCES:
            break
    mig.pending[gid] = tuple(layout)
    mig.made_for[gid] = rec.job.id
    led.set_blocked(gid, True)
    delay = part.mig.reconfigure_delay_s
    out.append(
        MigReconfigure(
            gpu=gid,
            layout=tuple(f"{i.profile}@{i.start}" for i in layout),
            reason=Reason.MIG_LAYOUT,
            ready_after_s=delay,
            message=f"re-partition idle GPU {gid} for pending {profile} demand",
        )
    )
    reasons.set_job(rec.job.id, Reason.RECONFIGURING, f"GPU {gid} re-partitioning ({delay:g} s)")
    return True


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
    hardware could not have (or one read while jobs run on the GPU) is not taken: the GPU is
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
            if st.busy():
                usable = False  # never re-index instances under running jobs
            else:
                led.set_mig_layout(gid, layout)
    if (gid in led.blocked) == usable:
        led.set_blocked(gid, not usable)
