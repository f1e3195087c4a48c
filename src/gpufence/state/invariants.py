"""Invariant checks over the ledger: recompute every GPU's state from the allocations and compare.

Cheap enough for tests (run after every step with validation on), too slow for the hot path.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufence.model import mig as migmod
from gpufence.model.decisions import Assignment
from gpufence.model.job import MILLI_PER_GPU, RequestKind
from gpufence.model.partition import PreemptionMode, SharingMode
from gpufence.state.ledger import HOLD_PREFIX, Allocation, Ledger


def check(ledger: Ledger, over_quota: Mapping[str, int] | None = None) -> list[str]:
    """Every broken invariant as a sentence; empty when the ledger is consistent.
    ``over_quota``: queue -> milli-GPU it may hold past nominal + borrowing (what it ran when
    its quota was lowered at run time: running work is never stopped for a quota)."""
    c = ledger.cluster
    problems: list[str] = []
    owner: dict[int, str] = {}
    milli = [0] * len(c.gpus)
    gmem = [0] * len(c.gpus)
    ts: dict[int, list[str]] = {}
    mig_occ: dict[tuple[int, int], str] = {}
    cpu = [0] * len(c.nodes)
    mem = [0] * len(c.nodes)
    lent: dict[str, int] = dict.fromkeys(c.partitions, 0)
    queue_used: dict[str, int] = dict.fromkeys(c.queues, 0)

    for jid, a in ledger.allocs.items():
        problems += _check_gang(jid, a)
        problems += _check_fence(ledger, jid, a)
        if a.lent_from is not None:
            lent[a.lent_from] += a.job.total_gpus
        if a.lent_from is not None or not a.incident:  # lent GPUs are charged to quota
            queue_used[a.queue] += a.charge_milli
        for s in a.assignments:
            cpu[s.node] += a.job.cpu_milli
            mem[s.node] += a.job.mem_mib
            for g in s.gpus:
                if c.gpus[g].node != s.node:
                    problems.append(f"job {jid}: GPU {g} is not on node {s.node}")
            if s.mig_profile is not None:
                key = (s.gpus[0], s.mig_start or 0)
                if key in mig_occ:
                    problems.append(f"MIG slot {key} held by {mig_occ[key]} and {jid}")
                mig_occ[key] = jid
            elif s.time_sliced:
                for g in s.gpus:
                    ts.setdefault(g, []).append(jid)
            elif a.job.request.kind is RequestKind.FRACTION:
                milli[s.gpus[0]] += s.milli
                gmem[s.gpus[0]] += s.gpu_mem_mib
            else:
                for g in s.gpus:
                    if g in owner:
                        problems.append(f"GPU {g} oversubscribed: {owner[g]} and {jid}")
                    owner[g] = jid

    if any(ledger.pool_held.values()):
        problems.append(f"GPUs counted on hold after the step: {ledger.pool_held}")
    if any(ledger.holders(p) for p in c.partitions):
        problems.append("hold tags still indexed after the step")
    by_pool = {jid: pool for pool, jobs in ledger.pool_allocs.items() for jid in jobs}
    if by_pool != {jid: a.pool for jid, a in ledger.allocs.items()}:
        problems.append("the ledger's allocations by pool differ from its allocations")
    for gpu in c.gpus:
        gid = gpu.gid
        held = ledger.owner[gid]
        if held is not None and held.startswith(HOLD_PREFIX):
            # holds (reservations, nominations) last one placement pass, never past a step
            problems.append(f"GPU {gid} still held for {held[len(HOLD_PREFIX) :]} after the step")
            held = None
        if held != owner.get(gid):
            problems.append(f"GPU {gid}: ledger owner {held} but allocations say {owner.get(gid)}")
        if gid in owner and (milli[gid] or ts.get(gid)):
            problems.append(f"GPU {gid} held whole by {owner[gid]} and shared at the same time")
        if milli[gid] != ledger.milli[gid] or milli[gid] > MILLI_PER_GPU:
            problems.append(f"GPU {gid}: {milli[gid]} milli allocated (ledger {ledger.milli[gid]})")
        if gmem[gid] > c.gpu_type_of(gid).memory_mib:
            problems.append(f"GPU {gid}: GPU memory oversubscribed ({gmem[gid]} MiB)")
        part = c.partitions[gpu.partition]
        occupants = ts.get(gid, [])
        if sorted(occupants) != sorted(ledger.ts[gid]):
            problems.append(f"GPU {gid}: time-slice occupants differ from allocations")
        if len(occupants) > max(part.time_slice_max, 1):
            problems.append(f"GPU {gid}: {len(occupants)} time-sliced jobs > {part.time_slice_max}")
        if part.sharing is not SharingMode.MIG and any(k[0] == gid for k in mig_occ):
            problems.append(f"GPU {gid}: MIG instance used outside a MIG partition")
    for gid, st in ledger.mig.items():
        model = c.gpu_type_of(gid).mig_model
        assert model is not None
        for msg in migmod.validate_layout(migmod.profiles_for(model), st.instances):
            problems.append(f"GPU {gid}: {msg}")
        if st.busy_count != sum(o is not None for o in st.occupant):
            problems.append(f"GPU {gid}: MIG busy count {st.busy_count} is stale")
        for inst, occ in zip(st.instances, st.occupant, strict=True):
            if mig_occ.get((gid, inst.start)) != occ:
                problems.append(f"GPU {gid}: MIG instance {inst} occupant mismatch")
    for n in c.nodes:
        if cpu[n.idx] != ledger.cpu_used[n.idx] or cpu[n.idx] > n.cpu_milli:
            problems.append(f"node {n.name}: CPU {cpu[n.idx]} milli used of {n.cpu_milli}")
        if mem[n.idx] > n.mem_mib:
            problems.append(f"node {n.name}: memory {mem[n.idx]} MiB used of {n.mem_mib}")
    for p, part in c.partitions.items():
        cap = sum(r.cap_gpus for r in part.lending)
        if lent[p] != ledger.lent[p] or lent[p] > cap:
            problems.append(f"partition {p}: lends {lent[p]} GPUs, cap {cap}")
    for q, spec in c.queues.items():
        used = queue_used[q]
        if used != ledger.queue_used[q]:
            problems.append(f"queue {q}: usage {used} differs from ledger {ledger.queue_used[q]}")
        if spec.nominal_milli is not None and spec.borrowing_limit_milli is not None:
            limit = spec.nominal_milli + spec.borrowing_limit_milli
            if used > max(limit, (over_quota or {}).get(q, 0)):
                problems.append(f"queue {q}: uses {used} milli > nominal+borrowing {limit}")
    problems += _check_indexes(ledger)
    return problems


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
    return out
