"""Submission checks: resolve a job's partition and queue, reject what can never run.

A job that no partition can ever hold is rejected at once with the reason, never left pending.
A job the core could not even reason about (a non-finite or out-of-range number: front ends
validate, but a store written by an older version, a trace or a bug may still hand one over) is
rejected as ``invalid`` naming the field, so one poisoned job never raises out of ``step``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpufence.model import mig as migmod
from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Reason
from gpufence.model.job import MILLI_PER_GPU, Job, RequestKind, WorkloadClass
from gpufence.model.partition import PreemptionMode, SharingMode
from gpufence.sched.admission import quota_never_admits
from gpufence.state.ledger import MigGpu, charge_milli

MigLayouts = Mapping[int, MigGpu]  # GPU -> its MIG state now (the ledger's)


@dataclass(frozen=True, slots=True)
class Accepted:
    home: str
    queue: str


@dataclass(frozen=True, slots=True)
class Refused:
    reason: Reason
    message: str


def _known(names: object) -> str:
    return ", ".join(sorted(str(n) for n in names))  # type: ignore[attr-defined]


MAX_SECONDS = 1e12
"""Upper bound of any duration or time the core accepts (~31,700 years: far beyond real
values, far below where float arithmetic on them loses whole seconds)."""
MAX_COUNT = 1 << 31
"""Upper bound of counts and sizes (GPUs, replicas, milli-CPUs, MiB, priority)."""


def _bad_number(field: str, value: object, lo: float, hi: float, optional: bool) -> str | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{field} must be a number (got {value!r})"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{field} must be finite (got {value!r})"
    if not lo <= value <= hi:
        return f"{field} must be between {_num(lo)} and {_num(hi)} (got {value!r})"
    return None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


_NUMBERS: tuple[tuple[str, float, float, bool], ...] = (
    ("est_runtime_s", 0.0, MAX_SECONDS, True),
    ("time_limit_s", 0.0, MAX_SECONDS, True),
    ("submit_time", -MAX_SECONDS, MAX_SECONDS, False),
    ("priority", -MAX_COUNT, MAX_COUNT, False),
    # below their minimum, replicas / gpus / milli get their own messages further on
    ("replicas", -MAX_COUNT, MAX_COUNT, False),
    ("cpu_milli", 0, MAX_COUNT, False),
    ("mem_mib", 0, MAX_COUNT, False),
    ("gpus", -MAX_COUNT, MAX_COUNT, False),
    ("milli", -MAX_COUNT, MAX_COUNT, False),
    ("gpu_mem_mib", 0, MAX_COUNT, False),
)
"""(field, lo, hi, optional) of every number ``invalid`` checks, in the order it reports them."""


def invalid(job: Job) -> Refused | None:
    """A field of ``job`` the core cannot compute with, named, or None."""
    req = job.request
    values = (
        job.est_runtime_s,
        job.time_limit_s,
        job.submit_time,
        job.priority,
        job.replicas,
        job.cpu_milli,
        job.mem_mib,
        req.gpus,
        req.milli,
        req.gpu_mem_mib,
    )
    for (field, lo, hi, optional), value in zip(_NUMBERS, values, strict=True):
        # the usual value, a plain int or float in range, costs one comparison (every job
        # submitted passes here); anything else gets _bad_number's full verdict
        if (value.__class__ is int or value.__class__ is float) and lo <= value <= hi:
            continue
        problem = _bad_number(field, value, lo, hi, optional)
        if problem is not None:
            return Refused(Reason.INVALID, problem)
    return None


def resolve(
    cluster: Cluster,
    job: Job,
    mig_now: MigLayouts | None = None,
    tenants: frozenset[str] | None = None,
) -> Accepted | Refused:
    """The job's partition and queue. A job that names neither goes to the first partition
    admitting its class that could ever hold it; it is refused only when none could."""
    bad = invalid(job)
    if bad is not None:
        return bad
    home, queue, err = _home_and_queue(cluster, job)
    if err is not None:
        return err
    cls = job.workload_class
    routed = not home
    homes = (
        [p for p, part in cluster.partitions.items() if cls in part.admits] if routed else [home]
    )
    refusals: list[tuple[str, Refused]] = []
    for p in homes:
        q = queue or default_queue(cluster, p, job.tenant, tenants)
        if q is None:
            refusals.append((p, _no_queue_for(cluster, p, job.tenant)))
            continue
        problem = _shape_problem(cluster, job, p, mig_now)
        if problem is None:
            never = quota_never_admits(cluster, q, charge_milli(job, cluster, p))
            if never is None:
                return Accepted(p, q)
            problem = Refused(Reason.NEVER_FITS, never)
        refusals.append((p, problem))
    # the partitions that offer this kind of request say the most about why it cannot run
    kind = job.request.kind
    if routed and any(_offers(cluster.partitions[p].sharing, kind) for p, _ in refusals):
        refusals = [(p, r) for p, r in refusals if _offers(cluster.partitions[p].sharing, kind)]
    if not routed or len(refusals) == 1:
        return refusals[0][1]
    why = "; ".join(f"{p}: {r.message}" for p, r in refusals)
    reason = refusals[0][1].reason if len({r.reason for _, r in refusals}) == 1 else None
    return Refused(reason or Reason.NEVER_FITS, f"no partition admitting {cls} can hold it ({why})")


def default_queue(
    cluster: Cluster, partition: str, tenant: str, tenants: frozenset[str] | None = None
) -> str | None:
    """The queue a job of ``tenant`` naming none goes to in ``partition``: the first of the
    tenant's own queues there, else the first queue nobody owns (no label, or one that names
    none of ``tenants``, when given); the admin's and the simulator's jobs (tenant "") the
    partition's first queue. None: every queue there is another tenant's, whose quota a job
    must never be charged to unasked."""
    names = cluster.partition_queues[partition]
    if not tenant:
        return names[0]
    owners = [(q, _owner(cluster.queues[q].tenant, tenants)) for q in names]
    return next((q for q, t in owners if t == tenant), None) or next(
        (q for q, t in owners if not t), None
    )


def _owner(label: str, tenants: frozenset[str] | None) -> str:
    return label if tenants is None or label in tenants else ""


def _no_queue_for(cluster: Cluster, partition: str, tenant: str) -> Refused:
    owned = ", ".join(
        f"{q} (tenant {cluster.queues[q].tenant})" for q in cluster.partition_queues[partition]
    )
    return Refused(
        Reason.INVALID,
        f"partition {partition} has no queue of tenant {tenant} and none without an owner "
        f"(its queues: {owned}); name a queue you may use with --queue",
    )


def _offers(sharing: SharingMode, kind: RequestKind) -> bool:
    if (kind is RequestKind.MIG) != (sharing is SharingMode.MIG):
        return False
    return kind is not RequestKind.FRACTION or sharing is SharingMode.FRACTIONAL


def _home_and_queue(cluster: Cluster, job: Job) -> tuple[str, str, Refused | None]:
    """The partition and queue the job names (either may be "": routed by ``resolve``)."""
    cls = job.workload_class
    if job.replicas < 1:
        return "", "", Refused(Reason.INVALID, f"replicas must be >= 1 (got {job.replicas})")
    if job.queue and job.queue not in cluster.queues:
        msg = f"queue '{job.queue}' does not exist (known: {_known(cluster.queues)})"
        return "", "", Refused(Reason.INVALID, msg)
    home = job.partition or (cluster.queues[job.queue].partition if job.queue else "")
    if home and home not in cluster.partitions:
        msg = f"partition '{home}' does not exist (known: {_known(cluster.partitions)})"
        return "", "", Refused(Reason.INVALID, msg)
    admitting = [p for p, part in cluster.partitions.items() if cls in part.admits]
    if not home and not admitting:
        return "", "", Refused(Reason.FENCE, f"no partition admits {cls} work")
    if home and cls not in cluster.partitions[home].admits:
        msg = f"partition {home} does not admit {cls} (partitions admitting {cls}: "
        msg += (", ".join(admitting) or "none") + ")"
        return "", "", Refused(Reason.FENCE, msg)
    if job.queue and cluster.queues[job.queue].partition != home:
        q = job.queue
        msg = f"queue {q} belongs to partition {cluster.queues[q].partition}, not {home}"
        return "", "", Refused(Reason.INVALID, msg)
    return home, job.queue, None


def _shape_problem(
    cluster: Cluster, job: Job, home: str, mig_now: MigLayouts | None = None
) -> Refused | None:
    """Why ``job``'s request can never be held by partition ``home`` (or is malformed)."""
    part = cluster.partitions[home]
    types = cluster.partition_gpu_types[home]
    if job.gpu_types and not types & set(job.gpu_types):
        return Refused(
            Reason.NEVER_FITS,
            f"GPU types {', '.join(job.gpu_types)} not in partition {home} (has {_known(types)})",
        )
    if job.request.kind is RequestKind.MIG:
        return _mig_problem(cluster, job, home, mig_now)
    if part.sharing is SharingMode.MIG:
        return Refused(Reason.NEVER_FITS, f"partition {home} only offers MIG instances")
    return _request_problem(cluster, job, home) or _size_problem(cluster, job, home)


def _mig_problem(
    cluster: Cluster, job: Job, home: str, mig_now: MigLayouts | None
) -> Refused | None:
    part = cluster.partitions[home]
    req = job.request
    if part.sharing is not SharingMode.MIG:
        return Refused(Reason.NEVER_FITS, f"partition {home} is {part.sharing}, not MIG")
    models = {cluster.gpu_types[t].mig_model for t in cluster.partition_gpu_types[home]}
    for model in sorted(m for m in models if m is not None):
        profiles = migmod.profiles_for(model)
        if req.mig_profile not in profiles:
            return Refused(
                Reason.NEVER_FITS,
                f"MIG profile '{req.mig_profile}' does not exist on {model} "
                f"(valid: {', '.join(profiles)})",
            )
    return _static_mig_problem(cluster, job, home, mig_now)


def _request_problem(cluster: Cluster, job: Job, home: str) -> Refused | None:
    """A GPU fraction or GPU count the partition cannot hold, or that is malformed."""
    part = cluster.partitions[home]
    req = job.request
    if req.kind is RequestKind.FRACTION:
        if part.sharing is not SharingMode.FRACTIONAL:
            return Refused(Reason.NEVER_FITS, f"partition {home} does not share GPUs by fraction")
        if not 0 < req.milli < MILLI_PER_GPU:
            return Refused(Reason.INVALID, f"gpu fraction must be in (0, 1) (got {req.milli}m)")
        biggest = max(cluster.gpu_types[t].memory_mib for t in cluster.partition_gpu_types[home])
        if req.gpu_mem_mib > biggest:
            return Refused(
                Reason.NEVER_FITS, f"needs {req.gpu_mem_mib} MiB GPU memory; largest GPU {biggest}"
            )
    elif req.gpus < 0:
        return Refused(Reason.INVALID, f"gpus per replica must be >= 0 (got {req.gpus})")
    elif req.gpus == 0 and job.cpu_milli == 0 and part.sharing is not SharingMode.FRACTIONAL:
        # a CPU-only replica (a prep or report step) is placed by its CPU: one asking for none
        # would hold nothing at all, and any number of them would fit on one node. (Fractional
        # partitions keep taking CPU-only pods as the openb traces give them.)
        return Refused(
            Reason.INVALID,
            "gpus per replica is 0 (a CPU-only replica) but it asks for no CPU; give cpus",
        )
    return None


def _size_problem(cluster: Cluster, job: Job, home: str) -> Refused | None:
    """A replica bigger than any node, or a gang bigger than the partition (and what it may
    borrow), or one its nodes can never hold at once."""
    part = cluster.partitions[home]
    req = job.request
    gids = cluster.partition_gpus[home]
    per_node = cluster.max_gpus_per_node(home)
    if req.gpus > per_node:
        return Refused(
            Reason.NEVER_FITS,
            f"a replica needs {req.gpus} GPUs on one node; nodes of {home} have at most {per_node}",
        )
    slots = len(gids) * (part.time_slice_max if part.sharing is SharingMode.TIME_SLICE else 1)
    lendable = sum(
        r.cap_gpus
        for p in cluster.partitions.values()
        for r in p.lending
        if home in r.to and (job.checkpointable or not r.checkpointable_only)
    )
    if job.total_gpus > slots + lendable and req.kind is RequestKind.WHOLE:
        return Refused(
            Reason.NEVER_FITS,
            f"gang needs {job.total_gpus} GPUs; partition {home} has {len(gids)}"
            + (f" (+{lendable} lendable)" if lendable else ""),
        )
    if req.kind is RequestKind.WHOLE and part.sharing is SharingMode.EXCLUSIVE:
        gang = _gang_problem(cluster, job, home)
        if gang is not None:
            return gang
    cpu_max, mem_max = cluster.partition_host_max[home]
    if job.cpu_milli > cpu_max or job.mem_mib > mem_max:
        return Refused(
            Reason.NEVER_FITS, f"a replica needs more CPU/memory than any node of {home}"
        )
    return None


def _replica_slots(
    cluster: Cluster, job: Job, pool: str, enough: int = 1 << 30
) -> tuple[int, list[int]]:
    """How many of ``job``'s replicas ``pool`` could hold at once, empty: per node, its GPUs
    of the pool (of the job's types, if it names any) over the GPUs per replica, rounded down
    -- a replica never spans nodes. Also the per-node GPU counts looked at, largest first.
    Stops counting at ``enough`` (a submit must not cost a walk over every node)."""
    need = max(1, job.request.gpus)
    types = job.gpu_types
    slots = 0
    counts: list[int] = []
    for n in cluster.partition_nodes[pool]:
        if types and cluster.nodes[n].gpu_type not in types:
            continue
        have = len(cluster.node_partition_gpus[(pool, n)])
        counts.append(have)
        slots += have // need
        if slots >= enough:
            break
    return slots, sorted(counts, reverse=True)


def _gang_problem(cluster: Cluster, job: Job, home: str) -> Refused | None:
    """A gang whose replicas can never all be placed at once -- at home, or in one pool that
    lends to it (within the rule's cap), or (serving) in a pool its fence preempts in -- by
    per-node capacity, GPU types and fences, not only by its total: e.g. 2 replicas of 5 GPUs
    on an 8-GPU and a 4-GPU node. (Placement puts a whole gang in one pool.)"""
    part = cluster.partitions[home]
    options = [(home, 1 << 30)]
    for lp, lender in cluster.partitions.items():
        for r in lender.lending:
            if home in r.to and lp != home and (job.checkpointable or not r.checkpointable_only):
                options.append((lp, r.cap_gpus))
    serving = job.workload_class is WorkloadClass.SERVING
    if serving and part.preemption.mode is not PreemptionMode.OFF:
        options += [(d, 1 << 30) for d in part.preemption.from_partitions]
    need = max(1, job.request.gpus)
    for pool, cap in options:
        if cluster.partitions[pool].sharing is not SharingMode.EXCLUSIVE:
            continue
        slots, _ = _replica_slots(cluster, job, pool, enough=job.replicas)
        if min(slots, cap // need) >= job.replicas:
            return None
    slots, counts = _replica_slots(cluster, job, home)
    typed = f" of type {', '.join(job.gpu_types)}" if job.gpu_types else ""
    nodes = ", ".join(str(n) for n in counts) or "none"
    more = " (nor can a pool that lends to it)" if len(options) > 1 else ""
    return Refused(
        Reason.NEVER_FITS,
        f"gang of {job.replicas} replicas x {need} GPUs on one node each can never be placed: "
        f"the nodes of {home} (GPUs{typed} per node: {nodes}) hold at most {slots} such "
        f"replicas{more}",
    )


def _static_mig_problem(
    cluster: Cluster, job: Job, home: str, mig_now: MigLayouts | None = None
) -> Refused | None:
    """A partition whose MIG layout never changes (``dynamic: false``) offers exactly the
    instances of its layout -- the ones read off the devices (``mig_now``: GPU -> its
    instances, from ``MigLayoutRead``) where known: a profile it does not have, or more
    replicas than it has instances of that profile, can never run."""
    mig = cluster.partitions[home].mig
    profile = job.request.mig_profile
    if mig is None or mig.dynamic or profile is None:
        return None
    per_model: dict[str, int] = {}
    have = 0
    for g in cluster.partition_gpus[home]:
        model = cluster.gpu_type_of(g).mig_model
        if model is None:
            continue
        if mig_now is not None and g in mig_now:
            have += sum(i.profile == profile for i in mig_now[g].instances)
            continue
        if model not in per_model:
            planned = migmod.plan_layout(migmod.profiles_for(model), mig.layout)
            per_model[model] = sum(i.profile == profile for i in planned)
        have += per_model[model]
    if have >= job.replicas:
        return None
    layout = ", ".join(mig.layout)
    if have == 0:
        why = f"MIG profile '{profile}' is not in the layout of partition {home} ({layout})"
    else:
        why = f"needs {job.replicas} {profile} instances; partition {home} has {have}"
    return Refused(Reason.NEVER_FITS, f"{why} and its layout is static (mig.dynamic: false)")
