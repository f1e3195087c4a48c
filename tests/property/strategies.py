"""Hypothesis strategies for property tests: random clusters, job streams and front-end actions.

Clusters are built with ``builders.ClusterBuilder`` and stay within what the YAML spec accepts
(lending caps <= the GPUs a partition holds, no self-lending or self-preemption, nominal quotas
summing to at most the partition's GPUs, static MIG layouts that fit one GPU, MIG partitions of a
single MIG model, time-slice max >= 2, interactive admitted where idle reclaim is on).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from gpufence.model import mig as migmod
from gpufence.model.cluster import Cluster
from gpufence.model.job import MILLI_PER_GPU, GpuRequest, Job, RequestKind, WorkloadClass
from gpufence.model.partition import (
    LendingRule,
    MigConfig,
    PreemptionMode,
    PreemptionPolicy,
    ReclaimPolicy,
    SharingMode,
)
from gpufence.sched.registry import SCORERS
from gpufence.testing.builders import ClusterBuilder

GPU_TYPES = ("H100-80GB", "A100-40GB")
CLASSES = tuple(WorkloadClass)

# NVLink layouts (domain sizes) per GPUs-per-node count.
NVLINK = {
    2: ((2,), (1, 1)),
    4: ((4,), (2, 2), (1, 1, 1, 1)),
    8: ((8,), (4, 4), (2, 2, 2, 2)),
}


@dataclass(frozen=True)
class World:
    """A random cluster plus what job generators need to know about it."""

    cluster: Cluster
    mig_model: dict[str, str] = field(default_factory=dict)  # MIG partition -> MIG model
    held: dict[str, int] = field(default_factory=dict)  # partition -> GPUs it holds
    node_names: tuple[str, ...] = ()

    @property
    def partitions(self) -> list[str]:
        return list(self.cluster.partitions)


def rare(draw: st.DrawFn, n: int) -> bool:
    """True about once in ``n + 1`` draws (at the top of the range: hypothesis favours 0, and
    shrinks toward it, so the common, valid case stays the simple one)."""
    return bool(draw(st.integers(0, n)) == n)


def _layout_prefix(model: str, names: list[str]) -> tuple[str, ...]:
    """Longest prefix of ``names`` that plans onto one GPU (so the layout is always legal)."""
    profiles = migmod.profiles_for(model)
    ok: list[str] = []
    for n in names:
        try:
            migmod.plan_layout(profiles, [*ok, n])
        except migmod.MigError:
            continue
        ok.append(n)
    return tuple(ok)


@st.composite
def worlds(draw: st.DrawFn, max_parts: int = 4, contended: bool = False) -> World:
    """``contended``: p0 is a serving fence that may preempt from p1 (incident-only or
    on-demand) and lends to p1; p1 is a training partition lending to p0 — so incident
    preemption, lent reclaim and lending get exercised, not just allowed."""
    n_racks = draw(st.integers(1, 4))
    n_parts = draw(st.integers(2 if contended else 1, max_parts))
    pnames = [f"p{i}" for i in range(n_parts)]
    sharing = {p: draw(st.sampled_from(list(SharingMode))) for p in pnames}
    ptype = {p: draw(st.sampled_from(GPU_TYPES)) for p in pnames}  # MIG partitions: one model
    n_groups = draw(st.integers(n_parts, n_parts + 2))
    cb = ClusterBuilder("prop")
    # group -> (owner partition, split partition or None, gpus per node, count)
    owners: list[tuple[str, str, str | None, int, int]] = []
    for gi in range(n_groups):
        owner = pnames[gi] if gi < n_parts else draw(st.sampled_from(pnames))
        mig_owner = sharing[owner] is SharingMode.MIG
        gtype = ptype[owner] if mig_owner else draw(st.sampled_from(GPU_TYPES))
        per = draw(st.sampled_from((2, 4, 8)))
        count = draw(st.integers(1, 6))
        nvlink = draw(st.sampled_from(NVLINK[per]))
        cores = draw(st.sampled_from((8, 32, 64)))
        mem = draw(st.sampled_from((64, 512)))
        rack = f"r{draw(st.integers(0, n_racks - 1))}"
        name = f"g{gi}"
        cb.nodes(
            name, count, per, rack=rack, gpu_type=gtype, nvlink=nvlink, cpu_cores=cores, mem_gib=mem
        )
        split: str | None = None
        compatible = [
            p
            for p in pnames
            if p != owner and (sharing[p] is not SharingMode.MIG or ptype[p] == gtype)
        ]
        if compatible and rare(draw, 4):
            split = draw(st.sampled_from(compatible))
        owners.append((name, owner, split, per, count))

    sel: dict[str, tuple[list[str], list[tuple[str, int, tuple[int, ...]]]]] = {
        p: ([], []) for p in pnames
    }
    held = dict.fromkeys(pnames, 0)
    for name, owner, split, per, count in owners:
        if split is None:
            sel[owner][0].append(name)
            held[owner] += per * count
            continue
        cut = per // 2
        for i in range(count):
            sel[owner][1].append((name, i, tuple(range(cut))))
            sel[split][1].append((name, i, tuple(range(cut, per))))
        held[owner] += cut * count
        held[split] += (per - cut) * count

    mig_model: dict[str, str] = {}
    for p in pnames:
        others = [q for q in pnames if q != p]
        mode = sharing[p]
        admits = set(draw(st.sets(st.sampled_from(CLASSES), min_size=1)))
        hot = contended and p in ("p0", "p1")
        if hot:
            admits.add(WorkloadClass.SERVING if p == "p0" else WorkloadClass.TRAINING)
        reclaim = None
        if draw(st.booleans()):
            admits.add(WorkloadClass.INTERACTIVE)
            reclaim = ReclaimPolicy(
                idle_threshold=draw(st.sampled_from((0.05, 0.3))),
                idle_after_s=draw(st.sampled_from((0.0, 30.0, 600.0))),
                warning_s=draw(st.sampled_from((0.0, 30.0, 120.0))),
            )
        kw: dict[str, object] = {"sharing": mode, "reclaim": reclaim}
        if mode is SharingMode.TIME_SLICE:
            kw["time_slice_max"] = draw(st.integers(2, 4))
        if mode is SharingMode.MIG:
            model = ptype[p]
            mig_model[p] = model
            names = list(migmod.profiles_for(model))
            layout = _layout_prefix(model, draw(st.lists(st.sampled_from(names), max_size=7)))
            dynamic = draw(st.booleans()) or not layout
            delay = draw(st.sampled_from((0.0, 5.0, 60.0)))
            # a MIG defrag budget: checkpointable jobs in a drained GPU's way may be stopped
            budget = draw(st.sampled_from((0, 3))) if dynamic else 0
            kw["mig"] = MigConfig(layout, dynamic, delay, defrag_budget=budget)
        if mode is SharingMode.FRACTIONAL:
            kw["placement"] = draw(st.sampled_from(sorted(SCORERS)))
        kw["backfill"] = draw(st.booleans())
        rules: list[LendingRule] = []
        if hot and draw(st.integers(0, 3)):
            rules.append(
                LendingRule(
                    to=("p1" if p == "p0" else "p0",),
                    cap_gpus=draw(st.integers(held[p] // 2, held[p])),
                    reclaim_deadline_s=draw(st.sampled_from((0.0, 30.0, 120.0))),
                    checkpointable_only=draw(st.booleans()),
                )
            )
        if others:
            for _ in range(draw(st.integers(0, 2))):
                rules.append(
                    LendingRule(
                        to=tuple(sorted(draw(st.sets(st.sampled_from(others), min_size=1)))),
                        cap_gpus=draw(st.integers(0, held[p])),
                        reclaim_deadline_s=draw(st.sampled_from((0.0, 30.0, 120.0))),
                        checkpointable_only=draw(st.booleans()),
                    )
                )
        kw["lending"] = tuple(rules)
        pmode = draw(st.sampled_from(list(PreemptionMode))) if others else PreemptionMode.OFF
        if contended and p == "p0":
            modes = (PreemptionMode.INCIDENT_ONLY, PreemptionMode.ON_DEMAND)
            pmode = draw(st.sampled_from(modes))
        if pmode is not PreemptionMode.OFF:
            sources = draw(st.sets(st.sampled_from(others), min_size=1))
            if contended and p == "p0":
                sources.add("p1")
            kw["preemption"] = PreemptionPolicy(
                mode=pmode,
                from_partitions=tuple(sorted(sources)),
                budget=draw(st.integers(1, 6)),
                window_s=draw(st.sampled_from((100.0, 86400.0))),
                min_runtime_s=draw(st.sampled_from((0.0, 60.0, 600.0))),
                grace_s=draw(st.sampled_from((0.0, 30.0, 120.0))),
            )
        parts = sel[p]
        cb.partition(p, groups=parts[0], gpus=parts[1], admits=frozenset(admits), **kw)
        n_queues = draw(st.integers(0, 3))
        budget = held[p] * MILLI_PER_GPU
        for qi in range(n_queues):
            nominal = None
            if draw(st.booleans()) and budget > 0:
                nominal = draw(st.integers(0, budget)) // 500 * 500
                budget -= nominal
            borrow = draw(st.one_of(st.none(), st.sampled_from((0, 1000, 4000))))
            lend = None
            if nominal is not None and draw(st.booleans()):
                lend = draw(st.integers(0, nominal))
            cb.queue(
                f"{p}q{qi}",
                p,
                tenant=f"t{qi}",
                weight=draw(st.sampled_from((0.5, 1.0, 2.0))),
                nominal_milli=nominal,
                borrowing_limit_milli=borrow,
                lending_limit_milli=lend,
            )
    cluster = cb.build()
    return World(
        cluster=cluster,
        mig_model=mig_model,
        held=held,
        node_names=tuple(n.name for n in cluster.nodes),
    )


@st.composite
def jobs(draw: st.DrawFn, world: World, job_id: str, now: float) -> tuple[Job, float]:
    """A random job aimed at a random partition (sometimes malformed) and its true duration
    (``inf`` = runs until finished or cancelled by the test)."""
    c = world.cluster
    p = draw(st.sampled_from(world.partitions))
    part = c.partitions[p]
    admitted = sorted(part.admits)
    cls = draw(st.sampled_from(CLASSES)) if rare(draw, 12) else draw(st.sampled_from(admitted))
    per_node = c.max_gpus_per_node(p) or 1
    replicas = draw(st.integers(1, 9)) if rare(draw, 3) else draw(st.integers(1, 3))
    mode = part.sharing
    # 2: a normal request; 1: a malformed one; 0: one of the wrong kind for the partition
    kind = 0 if rare(draw, 25) else 1 if rare(draw, 25) else 2
    req: GpuRequest
    if mode is SharingMode.MIG and kind:
        names = list(migmod.profiles_for(world.mig_model[p]))
        name = draw(st.sampled_from(names)) if kind > 1 else "9g.999gb"
        req = GpuRequest.mig(name)
        replicas = min(replicas, 3)
    elif mode is SharingMode.FRACTIONAL and kind and draw(st.integers(0, 2)):
        milli = draw(st.integers(1, 999)) if kind > 1 else draw(st.sampled_from((0, 1000)))
        mem = draw(st.sampled_from((0, 1024, 10240, 30720)))
        if rare(draw, 10):
            mem = 90000  # more than an A100-40GB holds
        req = GpuRequest.fraction(milli, mem)
    else:
        gpus = draw(st.integers(1, per_node)) if kind > 1 else draw(st.sampled_from((0, 16, -1)))
        req = GpuRequest.whole(gpus)
        if kind == 0 and draw(st.booleans()):
            req = draw(st.sampled_from((GpuRequest.mig("1g.10gb"), GpuRequest.fraction(300, 1024))))
    queues = list(c.partition_queues[p])
    queue = "nope" if rare(draw, 30) else draw(st.sampled_from(["", *queues]))
    partition = p if not queue or draw(st.booleans()) else ""
    if rare(draw, 40):
        partition = "nowhere"
    if rare(draw, 6):
        queue = partition = ""  # routed: the first admitting partition that could hold it
    duration = draw(st.sampled_from((float("inf"), 3000.0, 300.0, 30.0, 1.0)))
    est: float | None = None
    if draw(st.booleans()):
        est = (duration if duration != float("inf") else 3600.0) * draw(
            st.sampled_from((0.5, 1.0, 1.5))
        )
    limit: float | None = None
    if rare(draw, 4):
        limit = draw(st.sampled_from((1.0, 30.0, 200.0, 3000.0)))
    cpu = draw(st.sampled_from((0, 1000, 8000))) if rare(draw, 2) else 0
    if rare(draw, 30):
        cpu = 40000  # more than an 8-core node has
    mem_mib = draw(st.sampled_from((0, 4096, 100 * 1024))) if rare(draw, 3) else 0
    types: tuple[str, ...] = ()
    if rare(draw, 15):
        types = (draw(st.sampled_from((*GPU_TYPES, "TPU-v9"))),)
    job = Job(
        id=job_id,
        workload_class=cls,
        request=req,
        replicas=replicas,
        queue=queue,
        partition=partition,
        priority=draw(st.integers(0, 3)),
        checkpointable=draw(st.booleans()),
        est_runtime_s=est,
        submit_time=now,
        cpu_milli=cpu,
        mem_mib=mem_mib,
        gpu_types=types,
        time_limit_s=limit,
    )
    return job, duration


def is_fraction(job: Job) -> bool:
    return job.request.kind is RequestKind.FRACTION
