"""Topology-aware gang placement of whole GPUs: one NVLink domain, one node, one rack, fewest racks.

Works from the ledger's free-GPU buckets, so a 1-GPU job costs O(1) and a 64-GPU gang O(nodes in
the partition). Small jobs go best-fit (fullest node that still fits) so whole nodes and racks stay
whole for the gangs that need them.
"""

from __future__ import annotations

from collections.abc import Callable

from gpufence.model.decisions import Assignment, Reason
from gpufence.model.job import Job, RequestKind
from gpufence.sched.placement.fit import (
    NotPlaced,
    Placed,
    PlaceResult,
    node_admits,
    replicas_by_host,
)
from gpufence.state.ledger import Ledger


def pick_gpus(ledger: Ledger, node: int, free: list[int], want: int) -> list[int]:
    """``want`` GPUs from ``free`` on ``node``: one NVLink domain when possible (tightest first)."""
    c = ledger.cluster
    by_domain: dict[int, list[int]] = {}
    for g in free:
        by_domain.setdefault(c.gpus[g].nvlink_domain, []).append(g)
    fitting = [d for d in by_domain.values() if len(d) >= want]
    if fitting:
        return min(fitting, key=len)[:want]
    out: list[int] = []
    for d in sorted(by_domain.values(), key=len, reverse=True):
        out.extend(d[: want - len(out)])
        if len(out) == want:
            break
    return out


def _assign_from(
    ledger: Ledger, node: int, free: list[int], replicas: int, per: int
) -> list[Assignment]:
    out: list[Assignment] = []
    for _ in range(replicas):
        gpus = pick_gpus(ledger, node, free, per)
        free = [g for g in free if g not in gpus]
        out.append(Assignment(node=node, gpus=tuple(gpus)))
    return out


def place_whole(ledger: Ledger, job: Job, pool: str) -> PlaceResult:
    per = job.request.gpus
    need = job.total_gpus
    free_total = ledger.pool_free[pool]
    if free_total < need:
        text = f"partition {pool} has {free_total} free{held_for(ledger, pool)}"
        noun = "GPU" if need == 1 else "GPUs"
        return NotPlaced(Reason.NO_FIT, f"needs {need} free {noun}, {text}")
    buckets = ledger.buckets[pool]
    top = len(buckets) - 1
    # 1. the whole gang on one node, best fit (the fullest node that still fits)
    if need <= top:
        for k in range(need, top + 1):
            for node in buckets[k]:
                if node_admits(ledger, job, node, job.replicas):
                    return Placed(
                        tuple(
                            _assign_from(
                                ledger, node, ledger.free_gpus(pool, node), job.replicas, per
                            )
                        )
                    )
    # 2. across nodes (counts from the buckets; GPU lists only for the nodes chosen)
    candidates = [
        (node, k)
        for k in range(per, top + 1)
        for node in buckets[k]
        if node_admits(ledger, job, node)
    ]
    planned = spread(ledger, job, candidates, lambda n: ledger.free_gpus(pool, n))
    if planned is None and per == 0:  # CPU-only: only host room can be missing
        return NotPlaced(Reason.NO_FIT, f"no node of {pool} has {host_need(job)} free")
    if planned is None:
        host = _host_short(ledger, job, pool)
        where = host or f" but not {job.replicas} x {per} on usable nodes"
        return NotPlaced(Reason.FRAGMENTED, f"{free_total} GPUs free in {pool}{where}")
    return Placed(planned)


def _host_short(ledger: Ledger, job: Job, pool: str) -> str:
    """When the GPUs alone would take the gang but the nodes that have them lack CPU or host
    memory (FGD's stranded GPUs), what is short, with numbers, as ", but ..."; else ""."""
    per = job.request.gpus
    if per <= 0:
        return ""
    buckets = ledger.buckets[pool]
    slots, cpu, mem = 0, 0, 0
    for k in range(per, len(buckets)):
        for node in buckets[k]:
            typed = not job.gpu_types or ledger.cluster.nodes[node].gpu_type in job.gpu_types
            if ledger.node_up[node] and typed:
                slots += k // per
                cpu, mem = max(cpu, ledger.cpu_free(node)), max(mem, ledger.mem_free(node))
    if slots < job.replicas:
        return ""
    return (
        f", but the nodes with {per} of them free lack CPU or memory for a replica "
        f"({job.cpu_milli / 1000:g} CPUs, {job.mem_mib / 1024:.1f} GiB): "
        f"the most any of them has free is {cpu / 1000:g} CPUs and {mem / 1024:.1f} GiB"
    )


def host_need(job: Job) -> str:
    """What one CPU-only gang asks of nodes' hosts, in words: "2 x 1 CPU, 512 MiB"."""
    parts = [f"{job.cpu_milli / 1000:g} CPU"] if job.cpu_milli else []
    parts += [f"{job.mem_mib} MiB"] if job.mem_mib else []
    return f"{job.replicas} x " * (job.replicas > 1) + (", ".join(parts) or "room")


def held_for(ledger: Ledger, pool: str) -> str:
    """The idle GPUs of ``pool`` held for waiting jobs, as " (2 held for r1)", or ""."""
    held = ledger.holders(pool)
    return " (" + ", ".join(f"{n} held for {j}" for j, n in held.items()) + ")" if held else ""


def plan_on(ledger: Ledger, job: Job, free: dict[int, list[int]]) -> tuple[Assignment, ...] | None:
    """Place a gang on a hypothetical view (node -> free GPUs), e.g. the GPUs free at a future
    time for a backfill reservation. Same rules as ``place_whole``; host limits ignored."""
    need = job.total_gpus
    single = [(len(v), n) for n, v in free.items() if len(v) >= need]
    if single:
        _, node = min(single)
        return tuple(_assign_from(ledger, node, free[node], job.replicas, job.request.gpus))
    cands = [(n, len(v)) for n, v in free.items() if len(v) >= job.request.gpus]
    return spread(ledger, job, cands, free.__getitem__, host_limits=False)


def spread(
    ledger: Ledger,
    job: Job,
    candidates: list[tuple[int, int]],
    gpus_of: Callable[[int], list[int]],
    host_limits: bool = True,
) -> tuple[Assignment, ...] | None:
    """Replicas across nodes: in one rack when a rack can hold the gang -- the one where it
    spans the fewest nodes, then the tightest such rack --, else over the fewest racks (the
    roomiest first); inside a rack, the nodes with room for most replicas first."""
    per = job.request.gpus
    c = ledger.cluster
    racks: dict[str, list[tuple[int, int]]] = {}
    for node, free in candidates:
        cap = free // per if per else job.replicas  # CPU-only replicas: no GPU bound
        if host_limits:
            cap = min(cap, replicas_by_host(ledger, job, node))
        if cap > 0:
            racks.setdefault(c.nodes[node].rack, []).append((node, cap))
    for nodes in racks.values():
        nodes.sort(key=lambda t: (-t[1], t[0]))
    rack_cap = {r: sum(cap for _, cap in v) for r, v in racks.items()}
    if sum(rack_cap.values()) < job.replicas:
        return None
    fits_one = [r for r in c.racks if rack_cap.get(r, 0) >= job.replicas]
    if fits_one:
        chosen = [
            min(fits_one, key=lambda r: (_nodes_spanned(racks[r], job.replicas), rack_cap[r]))
        ]
    else:
        chosen = []
        got = 0
        for r in sorted(rack_cap, key=lambda r: -rack_cap[r]):
            chosen.append(r)
            got += rack_cap[r]
            if got >= job.replicas:
                break
    out: list[Assignment] = []
    left = job.replicas
    for r in chosen:
        for node, cap in racks[r]:
            take = min(cap, left)
            out.extend(_assign_from(ledger, node, gpus_of(node), take, per))
            left -= take
            if left == 0:
                return tuple(out)
    raise AssertionError("rack capacity was counted but not found")  # pragma: no cover


class WholeGpuPlacer:
    """Exclusive partitions: whole GPUs, one job per GPU."""

    offers = frozenset({RequestKind.WHOLE})

    def place(self, ledger: Ledger, job: Job, pool: str) -> PlaceResult:
        return place_whole(ledger, job, pool)


def _nodes_spanned(nodes: list[tuple[int, int]], replicas: int) -> int:
    """How many of ``nodes`` (node, replicas it can host; roomiest first) the gang needs."""
    left = replicas
    for i, (_, cap) in enumerate(nodes, 1):
        left -= cap
        if left <= 0:
            return i
    return len(nodes) + 1
