"""Invariant checks over the ledger: recompute every GPU's state from the allocations and compare.

Cheap enough for tests (run after every step with validation on), too slow for the hot path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpufence.model import mig as migmod
from gpufence.model.decisions import Assignment
from gpufence.model.job import MILLI_PER_GPU, RequestKind
from gpufence.model.partition import PreemptionMode, SharingMode
from gpufence.state.ledger import HOLD_PREFIX, Allocation, Ledger


def check(ledger: Ledger, over_quota: Mapping[str, int] | None = None) -> list[str]:
    """Every broken invariant as a sentence; empty when the ledger is consistent.
    ``over_quota``: queue -> milli-GPU it may hold past nominal + borrowing (what it ran when
    its quota was lowered at run time: running work is never stopped for a quota)."""
    t = _Tally.of(ledger)
    problems = t.problems
    problems += _check_holds(ledger)
    problems += _check_gpus(ledger, t)
    problems += _check_mig(ledger, t)
    problems += _check_nodes(ledger, t)
    problems += _check_lending_and_quota(ledger, t, over_quota or {})
    problems += _check_indexes(ledger)
    return problems


@dataclass(slots=True)
class _Tally:
    """What the allocations say, recomputed from them alone (the ledger's own counters are
    what is checked against it), and the problems found while counting."""

    owner: dict[int, str]  # GPU -> the job holding it whole
    milli: list[int]  # per GPU: fractional shares
    gmem: list[int]  # per GPU: fractional GPU memory (MiB)
    ts: dict[int, list[str]]  # GPU -> time-sliced occupants
    mig_occ: dict[tuple[int, int], str]  # (GPU, instance start) -> job
    cpu: list[int]  # per node
    mem: list[int]  # per node
    lent: dict[str, int]  # partition -> GPUs it lends
    queue_used: dict[str, int]  # queue -> milli-GPU charged to its quota
    problems: list[str]

    @classmethod
    def of(cls, ledger: Ledger) -> _Tally:
        c = ledger.cluster
        n_gpus, n_nodes = len(c.gpus), len(c.nodes)
        t = cls(
            {}, [0] * n_gpus, [0] * n_gpus, {}, {}, [0] * n_nodes, [0] * n_nodes,
            dict.fromkeys(c.partitions, 0), dict.fromkeys(c.queues, 0), [],
        )  # fmt: skip
        for jid, a in ledger.allocs.items():
            t.problems += _check_gang(jid, a)
            t.problems += _check_fence(ledger, jid, a)
            if a.lent_from is not None:
                t.lent[a.lent_from] += a.job.total_gpus
            if a.lent_from is not None or not a.incident:  # lent GPUs are charged to quota
                t.queue_used[a.queue] += a.charge_milli
            for s in a.assignments:
                t.add(ledger, jid, a, s)
        return t

    def add(self, ledger: Ledger, jid: str, a: Allocation, s: Assignment) -> None:
        """Count one replica's assignment by how it holds its GPUs."""
        self.cpu[s.node] += a.job.cpu_milli
        self.mem[s.node] += a.job.mem_mib
        for g in s.gpus:
            if ledger.cluster.gpus[g].node != s.node:
                self.problems.append(f"job {jid}: GPU {g} is not on node {s.node}")
        if s.mig_profile is not None:
            key = (s.gpus[0], s.mig_start or 0)
            if key in self.mig_occ:
                self.problems.append(f"MIG slot {key} held by {self.mig_occ[key]} and {jid}")
            self.mig_occ[key] = jid
        elif s.time_sliced:
            for g in s.gpus:
                self.ts.setdefault(g, []).append(jid)
        elif a.job.request.kind is RequestKind.FRACTION:
            self.milli[s.gpus[0]] += s.milli
            self.gmem[s.gpus[0]] += s.gpu_mem_mib
        else:
            for g in s.gpus:
                if g in self.owner:
                    self.problems.append(f"GPU {g} oversubscribed: {self.owner[g]} and {jid}")
                self.owner[g] = jid


def _check_holds(ledger: Ledger) -> list[str]:
    """Holds last one placement pass; the by-pool index matches the allocations."""
    c = ledger.cluster
    out: list[str] = []
    if any(ledger.pool_held.values()):
        out.append(f"GPUs counted on hold after the step: {ledger.pool_held}")
    if any(ledger.holders(p) for p in c.partitions):
        out.append("hold tags still indexed after the step")
    by_pool = {jid: pool for pool, jobs in ledger.pool_allocs.items() for jid in jobs}
    if by_pool != {jid: a.pool for jid, a in ledger.allocs.items()}:
        out.append("the ledger's allocations by pool differ from its allocations")
    return out


def _check_gpus(ledger: Ledger, t: _Tally) -> list[str]:
    """Each GPU is held one way at a time, within its shares, memory and time-slice cap."""
    c = ledger.cluster
    out: list[str] = []
    for gpu in c.gpus:
        gid = gpu.gid
        held = ledger.owner[gid]
        if held is not None and held.startswith(HOLD_PREFIX):
            # holds (reservations, nominations) last one placement pass, never past a step
            out.append(f"GPU {gid} still held for {held[len(HOLD_PREFIX) :]} after the step")
            held = None
        if held != t.owner.get(gid):
            out.append(f"GPU {gid}: ledger owner {held} but allocations say {t.owner.get(gid)}")
        if gid in t.owner and (t.milli[gid] or t.ts.get(gid)):
            out.append(f"GPU {gid} held whole by {t.owner[gid]} and shared at the same time")
        if t.milli[gid] != ledger.milli[gid] or t.milli[gid] > MILLI_PER_GPU:
            out.append(f"GPU {gid}: {t.milli[gid]} milli allocated (ledger {ledger.milli[gid]})")
        if t.gmem[gid] > c.gpu_type_of(gid).memory_mib:
            out.append(f"GPU {gid}: GPU memory oversubscribed ({t.gmem[gid]} MiB)")
        part = c.partitions[gpu.partition]
        occupants = t.ts.get(gid, [])
        if sorted(occupants) != sorted(ledger.ts[gid]):
            out.append(f"GPU {gid}: time-slice occupants differ from allocations")
        if len(occupants) > max(part.time_slice_max, 1):
            out.append(f"GPU {gid}: {len(occupants)} time-sliced jobs > {part.time_slice_max}")
        if part.sharing is not SharingMode.MIG and any(k[0] == gid for k in t.mig_occ):
            out.append(f"GPU {gid}: MIG instance used outside a MIG partition")
    return out


def _check_mig(ledger: Ledger, t: _Tally) -> list[str]:
    """Every MIG layout is legal for its GPU and its occupants are the allocations'."""
    out: list[str] = []
    for gid, st in ledger.mig.items():
        model = ledger.cluster.gpu_type_of(gid).mig_model
        assert model is not None
        for msg in migmod.validate_layout(migmod.profiles_for(model), st.instances):
            out.append(f"GPU {gid}: {msg}")
        if st.busy_count != sum(o is not None for o in st.occupant):
            out.append(f"GPU {gid}: MIG busy count {st.busy_count} is stale")
        for inst, occ in zip(st.instances, st.occupant, strict=True):
            if t.mig_occ.get((gid, inst.start)) != occ:
                out.append(f"GPU {gid}: MIG instance {inst} occupant mismatch")
    return out


def _check_nodes(ledger: Ledger, t: _Tally) -> list[str]:
    out: list[str] = []
    for n in ledger.cluster.nodes:
        if t.cpu[n.idx] != ledger.cpu_used[n.idx] or t.cpu[n.idx] > n.cpu_milli:
            out.append(f"node {n.name}: CPU {t.cpu[n.idx]} milli used of {n.cpu_milli}")
        if t.mem[n.idx] > n.mem_mib:
            out.append(f"node {n.name}: memory {t.mem[n.idx]} MiB used of {n.mem_mib}")
    return out


def _check_lending_and_quota(ledger: Ledger, t: _Tally, over_quota: Mapping[str, int]) -> list[str]:
    """Lending within each partition's cap; each queue within nominal + borrowing (lent GPUs
    included), or what it ran when its quota was lowered."""
    c = ledger.cluster
    out: list[str] = []
    for p, part in c.partitions.items():
        cap = sum(r.cap_gpus for r in part.lending)
        if t.lent[p] != ledger.lent[p] or t.lent[p] > cap:
            out.append(f"partition {p}: lends {t.lent[p]} GPUs, cap {cap}")
    for q, spec in c.queues.items():
        used = t.queue_used[q]
        if used != ledger.queue_used[q]:
            out.append(f"queue {q}: usage {used} differs from ledger {ledger.queue_used[q]}")
        if spec.nominal_milli is not None and spec.borrowing_limit_milli is not None:
            limit = spec.nominal_milli + spec.borrowing_limit_milli
            if used > max(limit, over_quota.get(q, 0)):
                out.append(f"queue {q}: uses {used} milli > nominal+borrowing {limit}")
    return out


def _check_gang(jid: str, a: Allocation) -> list[str]:
    job = a.job
    if len(a.assignments) != job.replicas:
        return [f"gang {jid}: {len(a.assignments)} of {job.replicas} replicas placed"]
    want = job.request.gpus if job.request.kind is RequestKind.WHOLE else 1
    bad: list[Assignment] = [s for s in a.assignments if len(s.gpus) != want]
    return [f"gang {jid}: a replica got {len(bad[0].gpus)} GPUs, wants {want}"] if bad else []


def _check_fence(ledger: Ledger, jid: str, a: Allocation) -> list[str]:
    c = ledger.cluster
    out = [
        f"job {jid}: GPU {g} is in partition {c.gpus[g].partition}, not {a.pool}"
        for g in a.gpu_ids()
        if c.gpus[g].partition != a.pool
    ]
    if a.pool == a.home:
        return out
    if a.lent_from == a.pool:
        rules = [r for r in c.partitions[a.pool].lending if a.home in r.to]
        if not rules:
            out.append(f"job {jid}: crossed into {a.pool}, which lends nothing to {a.home}")
        elif all(r.checkpointable_only for r in rules) and not a.job.checkpointable:
            out.append(f"job {jid}: borrows from {a.pool} but is not checkpointable")
        return out
    pol = c.partitions[a.home].preemption
    if not (a.incident and pol.mode is not PreemptionMode.OFF and a.pool in pol.from_partitions):
        out.append(f"job {jid} of {a.home} runs in {a.pool} without lending or incident rule")
    return out


def _check_indexes(ledger: Ledger) -> list[str]:
    out: list[str] = []
    for (p, node), gids in ledger.cluster.node_partition_gpus.items():
        free = sum(1 for g in gids if ledger.is_free(g))
        if ledger.free_count[(p, node)] != free:
            out.append(f"index: ({p}, node {node}) free {ledger.free_count[(p, node)]} != {free}")
        elif node not in ledger.buckets[p][free]:
            out.append(f"index: node {node} missing from bucket {free} of {p}")
    want: dict[tuple[str, str], dict[int, int]] = {}
    for g, st in ledger.mig.items():
        pool = ledger.cluster.gpus[g].partition
        for inst, occ in zip(st.instances, st.occupant, strict=True):
            if occ is None:
                per = want.setdefault((pool, inst.profile), {})
                per[g] = per.get(g, 0) + 1
    have = {k: v for k, v in ledger.mig_free.items() if v}
    if want != have:
        out.append(f"index: free MIG instances {have} != {want}")
    totals: dict[str, int] = {}
    for (pool, _), per in want.items():
        totals[pool] = totals.get(pool, 0) + sum(per.values())
    if {p: n for p, n in ledger.mig_free_total.items() if n} != totals:
        out.append(f"index: free MIG totals {ledger.mig_free_total} != {totals}")
    return out + _check_mig_counts(ledger, want)


def _check_mig_counts(ledger: Ledger, want: dict[tuple[str, str], dict[int, int]]) -> list[str]:
    """The ledger's counts of free MIG instances per (pool, profile), and those on blocked
    GPUs, against ``want`` (the free instances found by a scan)."""
    out: list[str] = []
    counts = {k: sum(per.values()) for k, per in want.items()}
    if {k: n for k, n in ledger.mig_free_count.items() if n} != counts:
        out.append(f"index: free MIG counts {ledger.mig_free_count} != {counts}")
    blocked: dict[tuple[str, str], int] = {}
    for (pool, prof), per in want.items():
        n = sum(v for g, v in per.items() if g in ledger.blocked)
        if n:
            blocked[(pool, prof)] = n
    if {k: n for k, n in ledger.mig_free_blocked.items() if n} != blocked:
        out.append(f"index: free MIG on blocked GPUs {ledger.mig_free_blocked} != {blocked}")
    blocked_totals: dict[str, int] = {}
    for (pool, _), n in blocked.items():
        blocked_totals[pool] = blocked_totals.get(pool, 0) + n
    if {p: n for p, n in ledger.mig_free_blocked_total.items() if n} != blocked_totals:
        out.append(f"index: blocked MIG totals {ledger.mig_free_blocked_total} != {blocked_totals}")
    return out
