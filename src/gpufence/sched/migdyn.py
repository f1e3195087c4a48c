"""Dynamic MIG re-partitioning: a GPU's idle instances are re-cut, with a delay, around the ones
jobs run on (never under them); the new layout is built by ``sched/migcut.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufence.model import mig as migmod
from gpufence.model.decisions import Decision, MigReconfigure, Reason
from gpufence.model.events import MigLayoutRead
from gpufence.sched import migcut, migdrain, migindex
from gpufence.sched.context import Core
from gpufence.sched.jobs import JobRecord
from gpufence.sched.migcut import destroyed, unmet_demand
from gpufence.sched.migdefrag_stop import DefragState
from gpufence.sched.migdrain import Drain
from gpufence.sched.migindex import PoolIndex
from gpufence.sched.placement.fit import node_admits
from gpufence.sched.placement.mig_room import Size, cut_key, starts_beside
from gpufence.sched.reasons import PendingReasons


@dataclass(slots=True)
class MigWork:
    """Re-partitions in flight and what they were for."""

    pending: dict[int, tuple[migmod.MigInstance, ...]] = field(default_factory=dict)  # GPU -> new
    made_for: dict[int, str] = field(default_factory=dict)  # GPU -> job it was re-partitioned for
    index: dict[str, PoolIndex] = field(default_factory=dict)  # MIG pool -> GPUs to re-cut
    drains: dict[str, Drain] = field(default_factory=dict)  # MIG pool -> its GPU being drained
    # GPU being re-cut -> the jobs that wait for its new instances: job -> (profile, how many)
    waiting: dict[int, dict[str, tuple[str, int]]] = field(default_factory=dict)
    offers: dict[int, dict[str, int]] = field(default_factory=dict)  # GPU -> new instances
    defrag: DefragState = field(default_factory=DefragState)  # stops for drains (migdefrag_stop)

    def reconfigured(self, core: Core, gpu: int) -> None:
        """The front end applied the layout asked for on ``gpu``: it is usable again."""
        layout = self.pending.pop(gpu, None)
        self.waiting.pop(gpu, None)
        self.offers.pop(gpu, None)
        if layout is not None:
            core.ledger.set_mig_layout(gpu, layout)
            core.ledger.set_blocked(gpu, False)


def _in_flight_for(core: Core, mig: MigWork, rec: JobRecord, profile: str, needed: int) -> bool:
    """Whether ``rec`` waits for a re-cut in flight: it did already, or a GPU of its pool is
    being re-cut with ``needed`` new ``profile`` instances no job ahead of it waits for (a re-cut
    serves the demand queued behind the job it was made for too)."""
    jid = rec.job.id
    for waiting in mig.waiting.values():
        if jid in waiting:
            return True
    for g, offer in mig.offers.items():
        new = offer.get(profile, 0)
        if new < needed or core.cluster.gpus[g].partition != rec.home:
            continue
        waiting = mig.waiting.setdefault(g, {})
        promised = sum(n for j, (p, n) in waiting.items() if p == profile and j in core.queues)
        if new - promised >= needed:
            waiting[jid] = (profile, needed)
            return True
    return False


def _order(rec: JobRecord) -> tuple[int, float, str]:
    return (-rec.job.priority, rec.job.submit_time, rec.job.id)


def _kept(core: Core, mig: MigWork, gpu: int, rec: JobRecord) -> bool:
    """The GPU was re-partitioned for a job that still waits and is ``rec`` itself (its layout
    is already what ``rec`` asked for) or ahead of it: taking it would undo that work, and two
    jobs taking each other's GPUs would re-partition them back and forth forever."""
    owner = mig.made_for.get(gpu)
    if owner is None or owner not in core.queues:
        return False
    if mig.defrag.keeps_from(owner, rec.job.id):  # rec was stopped for owner (migdefrag_stop)
        return True
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
    needed = _needed(core, rec, pool, profile)
    if needed is None:
        return ""
    drain = mig.drains.get(pool)
    if drain is not None and drain.job_id == rec.job.id:
        # (a GPU that freed up meanwhile ends the drain as well: waiting on would idle both)
        if not migdrain.drained(core, drain) and isinstance(
            _choose(core, mig, rec, profile, needed, explain=False), str
        ):
            return migdrain.waiting_for(core, drain)
        del mig.drains[pool]
        migdrain.end_drain(core, drain)  # and re-cut it (or a GPU that freed up meanwhile)
    if _in_flight_for(core, mig, rec, profile, needed):
        reasons.set_job(
            rec.job.id, Reason.RECONFIGURING, f"a GPU is being re-partitioned for {profile}"
        )
        return None
    cut = _choose(core, mig, rec, profile, needed)
    if isinstance(cut, str):
        return _drain_for(core, mig, rec, profile, needed) or cut
    gid, layout = cut
    mig.pending[gid] = tuple(layout)
    mig.made_for[gid] = rec.job.id
    mig.waiting[gid] = {rec.job.id: (profile, needed)}
    st = core.ledger.mig[gid]
    running = {i for i, o in zip(st.instances, st.occupant, strict=True) if o is not None}
    offer: dict[str, int] = {}
    for i in layout:  # (running instances only end while the GPU is blocked: never new ones)
        if i not in running:
            offer[i.profile] = offer.get(i.profile, 0) + 1
    mig.offers[gid] = offer
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


def _drain_for(core: Core, mig: MigWork, rec: JobRecord, profile: str, needed: int) -> str:
    """Start draining a GPU for ``rec`` where that is the way out (``migdrain``): why it waits
    then, or "" when no drain is started."""
    pool = rec.home
    if pool in mig.drains or needed != 1 or not _recut_busy(core, pool):
        # (a drain frees room beside running instances: no use where a re-cut takes the GPU)
        return ""
    ix = mig.index[pool]
    room = ix.memo.get(("room", profile))
    if not isinstance(room, bool):  # the same until a node of the pool changes
        room = ix.memo[("room", profile)] = migdrain.scattered_room(core, pool, profile)
    if not room:
        return ""
    drain = migdrain.start_drain(core, ix, rec, profile)
    if drain is None:
        return ""
    mig.drains[pool] = drain
    return migdrain.waiting_for(core, drain)


def _node_name(core: Core, gpu: int) -> str:
    return core.cluster.nodes[core.cluster.gpus[gpu].node].name


def _recut_busy(core: Core, pool: str) -> bool:
    mig = core.cluster.partitions[pool].mig
    return mig is None or mig.recut_busy


def release_drains(core: Core, mig: MigWork) -> None:
    """End the drains whose jobs no longer wait (started elsewhere, cancelled)."""
    for pool, drain in list(mig.drains.items()):
        if drain.job_id not in core.queues:
            del mig.drains[pool]
            migdrain.end_drain(core, drain)


def _needed(core: Core, rec: JobRecord, pool: str, profile: str) -> int | None:
    """Instances of ``profile`` one re-cut GPU must add for the whole job to fit: the replicas
    that free instances elsewhere do not cover (at least one: a job that waits beside free
    instances lacks CPU or memory there, and a GPU on another node may serve it); None when one
    GPU cannot add that many."""
    if rec.job.replicas == 1:
        return 1  # (the common case: no count of the free instances can make it less)
    led = core.ledger
    free_now = sum(n for g, n in led.mig_free.get((pool, profile), {}).items() if led.gpu_usable(g))
    needed = max(1, rec.job.replicas - free_now)
    return needed if needed <= migmod.MAX_INSTANCES else None


def _choose(
    core: Core, mig: MigWork, rec: JobRecord, profile: str, needed: int, explain: bool = True
) -> tuple[int, list[migmod.MigInstance]] | str:
    """The GPU to re-cut and its new layout, or why there is none ("" unless ``explain``: a
    drain asks only whether a GPU can be cut). GPUs are ranked like placement
    (``mig_room.cut_key``: least room that still takes the profile, beside the running
    instances alone), then by the idle instances the cut destroys, then by GPU index; ranks are
    per group of GPUs that hold the same (``migindex``)."""
    pool = rec.home
    ix = mig.index.get(pool)
    if ix is None:  # (not as get's default: a new index, a dozen tables, on every call)
        ix = PoolIndex()
    ix = mig.index[pool] = migindex.refresh(core, ix, pool, mig.pending)
    job = rec.job
    # a job like one that found no GPU since the pool last changed finds none either
    nothing = ("none", profile, needed, job.cpu_milli, job.mem_mib, job.gpu_types)
    why = ix.memo.get(nothing)
    if isinstance(why, str):
        return why
    fitting = _fitting_groups(ix, profile, not _recut_busy(core, pool))
    ranked, kept = _candidates(core, mig, ix, rec, fitting, needed)
    ranked.sort(key=lambda r: (r[0], r[1]))
    demand: list[str] | None = None
    for _, g, sid in ranked[:_TRIES]:
        if demand is None:
            demand = unmet_demand(core, pool, rec)
        model, running, idle = ix.sigs[sid]
        layout = migcut.full_layout(model, running, idle, [profile] * needed, demand)
        if layout is not None:
            return g, layout
    if not explain:
        return ""
    why = ix.memo.get(("why", profile))
    if not isinstance(why, str):  # the pool's state alone says it: kept until that changes
        why = ix.memo[("why", profile)] = _why_none(core, mig, ix, rec, fitting)
    if not kept and not ranked:
        ix.memo[nothing] = why
    return why


def _fitting_groups(ix: PoolIndex, profile: str, whole_only: bool) -> list[tuple[_Rank, int]]:
    """The pool's groups where ``profile`` fits after a re-cut, (rank, group) best first.
    ``whole_only``: a GPU with running instances is no candidate (where re-cuts take whole
    GPUs). Asked every cycle a MIG shape waits, mostly of pools where no group fits: each
    group is ranked once per profile (what a group holds is its number), when it is made."""
    fits = ix.fits.setdefault(profile, {})
    pos, sids = ix.fitting.get(profile, (0, set()))
    for sid in ix.born[pos:]:
        rank = fits.get(sid, _UNRANKED)
        if rank is _UNRANKED:
            rank = fits[sid] = None if whole_only and ix.sigs[sid][1] else _rank(ix, sid, profile)
        if rank is not None:
            sids.add(sid)
    gone = [sid for sid in sids if sid not in ix.groups]
    sids.difference_update(gone)
    ix.fitting[profile] = (len(ix.born), sids)
    fitting: list[tuple[_Rank, int]] = [(fits[sid], sid) for sid in sids]  # type: ignore[misc]
    # groups best first; a group's GPUs are ascending, so the walk meets candidates in (rank,
    # GPU) order except across groups of equal rank: take those whole before stopping
    fitting.sort(key=lambda rs: (rs[0], ix.groups[rs[1]][0]))
    return fitting


_UNRANKED = object()


def _candidates(
    core: Core,
    mig: MigWork,
    ix: PoolIndex,
    rec: JobRecord,
    fitting: list[tuple[_Rank, int]],
    needed: int,
) -> tuple[list[tuple[_Rank, int, int]], bool]:
    """Up to ``_TRIES`` GPUs per rank to try, (rank, GPU, group), whose node admits the job;
    and whether a GPU was passed over because it is kept for another job (that depends on the
    job, not on its shape, so a "none" found then is not remembered)."""
    ranked: list[tuple[_Rank, int, int]] = []
    kept = False
    for rank, sid in fitting:
        if len(ranked) >= _TRIES and rank > ranked[-1][0]:
            break
        taken = 0
        for g in ix.groups[sid]:
            if taken == _TRIES:
                break
            if _kept(core, mig, g, rec):
                kept = True
            elif node_admits(core.ledger, rec.job, core.cluster.gpus[g].node, needed):
                ranked.append((rank, g, sid))
                taken += 1
    return ranked, kept


_Rank = tuple[Size, int, tuple[Size, Size, int], int]


def _rank(ix: PoolIndex, sid: int, profile: str) -> _Rank | None:
    """Best fit by room first, then the fewest idle instances destroyed, then what is left;
    None when ``profile`` does not fit beside the running instances."""
    key = (sid, profile)
    if key in ix.ranks:  # a group's rank never changes: what it holds is its number
        return ix.ranks[key]  # type: ignore[return-value]
    model, running, idle = ix.sigs[sid]
    profiles = migmod.profiles_for(model)
    best: _Rank | None = None
    for s in starts_beside(model, running, profile):
        cut = cut_key(model, running, profile, s)
        lost = destroyed(profiles, idle, migmod.MigInstance(profile, s))
        rank = (cut[0], lost, cut, s)
        if best is None or rank < best:
            best = rank
    ix.ranks[key] = best
    return best


_TRIES = 8  # GPUs tried for a gang's instances (the best-ranked one almost always takes them)
_SHOWN = 3  # blocked GPUs named in a pending reason


def _why_none(
    core: Core, mig: MigWork, ix: PoolIndex, rec: JobRecord, fitting: list[tuple[_Rank, int]]
) -> str:
    """Which GPUs block the profile: at each legal start, the jobs whose instances are there
    (the lowest ``_SHOWN`` GPUs of the groups where it does not fit, and how many more)."""
    pool, profile = rec.home, rec.job.request.mig_profile or ""
    busy = _recut_busy(core, pool)
    fit = {sid for _, sid in fitting}
    n_blocked = len(ix.sig_of) - sum(len(ix.groups[sid]) for sid in fit)
    parts: list[str] = []
    for g in ix.order:
        if len(parts) == _SHOWN or len(parts) == n_blocked:
            break
        if ix.sig_of[g] not in fit:
            parts.append(_blocking(core, ix, g, profile) if busy else _runs(core, g))
    if n_blocked > len(parts):
        parts.append(f"{n_blocked - len(parts)} more GPUs alike")
    recut = sorted(g for g in mig.pending if core.cluster.gpus[g].partition == pool)
    if recut:
        parts.append("being re-cut: GPU " + ", ".join(str(g) for g in recut))
    where = f" ({'; '.join(parts)})" if parts else ""
    if not busy:
        return f"no idle GPU in {pool} to re-cut for {profile}, a re-cut takes a whole GPU{where}"
    return f"no GPU in {pool} can be re-cut for {profile} beside its running instances{where}"


def _runs(core: Core, g: int) -> str:
    """Where a re-cut takes a whole GPU: the jobs running on GPU ``g`` (kept in the GPU's
    memo, which is emptied when its instances or their jobs change)."""
    memo = core.ledger.mig[g].memo
    said = memo.get("runs")
    if not isinstance(said, str):
        jobs = ", ".join(j for _, j in migindex.running_jobs(core, g))
        said = memo["runs"] = f"GPU {g} on {_node_name(core, g)} runs {jobs}"
    return said


def _blocking(core: Core, ix: PoolIndex, g: int, profile: str) -> str:
    """At each legal start of ``profile`` on GPU ``g``, the jobs whose instances are there
    (kept in the GPU's memo: what it says follows from the GPU's instances and their jobs)."""
    memo = core.ledger.mig[g].memo
    said = memo.get(("blocking", profile))
    if isinstance(said, str):
        return said
    sid = ix.sig_of[g]
    key = ("in the way", sid, profile)
    way = ix.ranks.get(key)  # a group's geometry never changes: kept for the index's life
    if way is None:
        model, running, _ = ix.sigs[sid]
        profiles = migmod.profiles_for(model)
        p = profiles[profile]
        spans = [migmod.span_mask(i.start, profiles[i.profile].mem_slices) for i in running]
        way = ix.ranks[key] = [
            (s, [k for k, m in enumerate(spans) if m & migmod.span_mask(s, p.mem_slices)])
            for s in p.starts
        ]
    jobs = [j for _, j in migindex.running_jobs(core, g)]  # in the group's order (by start)
    out: list[str] = []
    for s, ks in way:  # type: ignore[attr-defined]
        # no overlap: the per-GPU caps (instances of the profile, 7 in all) are what block it
        who = ", ".join(jobs[k] for k in ks)
        out.append(f"@{s} under {who}" if who else f"@{s} over the per-GPU limits")
    said = memo[("blocking", profile)] = f"GPU {g}: " + ", ".join(out)
    return said


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
    mig.waiting.pop(gid, None)
    mig.offers.pop(gid, None)
    mig.made_for.pop(gid, None)
    for pool, drain in list(mig.drains.items()):
        if drain.gpu == gid:  # what the GPU holds is read anew: placement decides again
            del mig.drains[pool]
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
    if usable and ev.recutting and st is not None:
        _restore_recut(core, mig, gid)
        return
    if (gid in led.blocked) == usable:
        led.set_blocked(gid, not usable)


def _restore_recut(core: Core, mig: MigWork, gid: int) -> None:
    """A re-cut into the layout just read is still being carried out (the front end
    restarted meanwhile): the GPU waits for ``MigReconfigured`` as after ``repartition_for``,
    and its new idle instances are offered to the jobs that wait for them."""
    st = core.ledger.mig[gid]
    mig.pending[gid] = tuple(st.instances)
    offer: dict[str, int] = {}
    for i, o in zip(st.instances, st.occupant, strict=True):
        if o is None:
            offer[i.profile] = offer.get(i.profile, 0) + 1
    mig.offers[gid] = offer
    core.ledger.set_blocked(gid, True)
