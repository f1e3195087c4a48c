"""Placement in fractional partitions: milli-GPU shares on one GPU, whole GPUs on one node, or
CPU-only replicas (``GpuRequest.whole(0)``) that take only CPU and memory.

The pool is mirrored as numpy arrays (``PoolIndex``: one row per node, one column per GPU slot)
rebuilt from the ledger on every call, so what-if forks and rollbacks need no bookkeeping here. A
node's version changes whenever its free GPU, CPU or memory changes; scores of a pod shape are
cached per node and recomputed only for the nodes that changed since the shape was last scored.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Assignment, Reason
from gpufence.model.job import MILLI_PER_GPU, Job, RequestKind
from gpufence.sched.placement.fit import NotPlaced, Placed, PlaceResult
from gpufence.sched.placement.scoring import (
    BoolArr,
    Candidates,
    FloatArr,
    IntArr,
    PodSpec,
    Scorer,
)
from gpufence.sched.placement.whole import pick_gpus
from gpufence.state.ledger import Ledger

CACHE_SHAPES = 512  # pod shapes whose per-node scores are kept (least recently used dropped)


@dataclass(slots=True)
class _Scores:
    version: IntArr  # node version each score was computed at (-1: never)
    score: FloatArr
    col: IntArr


@dataclass
class PoolIndex:
    """Free capacity of one pool's nodes as arrays; ``sync`` refreshes it from the ledger."""

    cluster: Cluster
    pool: str
    nodes: IntArr = field(init=False)  # (N,) node index per row
    gids: IntArr = field(init=False)  # (N, G) GPU id per column; len(gpus) for padding
    tid: IntArr = field(init=False)  # (N,) GPU type id per row
    types: tuple[str, ...] = field(init=False)
    free: IntArr = field(init=False)  # (N, G) free milli (0: padding, held, unusable)
    cpu: IntArr = field(init=False)
    mem: IntArr = field(init=False)
    up: BoolArr = field(init=False)
    version: IntArr = field(init=False)
    changed: IntArr = field(init=False)  # rows whose state changed at the last sync
    cache: OrderedDict[tuple[object, ...], _Scores] = field(init=False)

    def __post_init__(self) -> None:
        c = self.cluster
        rows = c.partition_nodes[self.pool]
        self.nodes = np.array(rows, dtype=np.int64)
        width = max((len(c.node_partition_gpus[(self.pool, n)]) for n in rows), default=0)
        self.gids = np.full((len(rows), width), len(c.gpus), dtype=np.int64)
        for r, n in enumerate(rows):
            g = c.node_partition_gpus[(self.pool, n)]
            self.gids[r, : len(g)] = g
        self.types = tuple(sorted({c.nodes[n].gpu_type for n in rows}))
        self.tid = np.array([self.types.index(c.nodes[n].gpu_type) for n in rows], dtype=np.int64)
        self._cpu_cap = np.array([c.nodes[n].cpu_milli for n in rows], dtype=np.int64)
        self._mem_cap = np.array([c.nodes[n].mem_mib for n in rows], dtype=np.int64)
        self._gpu_node = np.array([g.node for g in c.gpus], dtype=np.int64)
        self.cpu_cap = int(self._cpu_cap.max(initial=1))
        self.mem_cap = int(self._mem_cap.max(initial=1))
        self.gpu_cap = max(width, 1) * MILLI_PER_GPU
        n = len(rows)
        self.free = np.zeros((n, width), dtype=np.int64)
        self.cpu = np.zeros(n, dtype=np.int64)
        self.mem = np.zeros(n, dtype=np.int64)
        self.up = np.zeros(n, dtype=np.bool_)
        self.version = np.zeros(n, dtype=np.int64)
        self.changed = np.arange(n, dtype=np.int64)
        self.cache = OrderedDict()
        self._clock = 0
        self._full_synced = False
        self._gmem_cap: IntArr | None = None
        self._gmem_slots: IntArr = np.zeros(0, dtype=np.int64)
        self._gmem_gids: list[int] = []
        self._gmem: IntArr = np.zeros(0, dtype=np.int64)
        self._gmem_at = -1  # the pool's version (ledger.pool_version) of ``_gmem``
        self._most: tuple[int, int, int] = (-1, 0, 0)  # (pool version, GPU mem, host mem)
        self._totals: tuple[int, int, int] = (-1, 0, 0)  # (clock, free milli, CPU) of up rows
        self._synced = -1
        self._row_of = {int(n): r for r, n in enumerate(rows)}
        self._epoch = -1
        self._log_pos = 0
        self.max_free = 0

    def sync(self, ledger: Ledger) -> None:
        if ledger.version == self._synced:
            return  # nothing changed since the last sync
        self._synced = ledger.version
        log = ledger.node_log
        if self._full_synced and self._epoch == ledger.log_epoch:
            touched = {n for n in log[self._log_pos :] if n in self._row_of}
            self._log_pos = len(log)
            self._sync_rows(ledger, touched)
            return
        self._epoch = ledger.log_epoch
        self._log_pos = len(log)
        # full refresh: first sync, or the ledger's change log was cut short
        n = len(self.cluster.gpus)
        node_up = np.fromiter(ledger.node_up, np.bool_, len(self.cluster.nodes))
        milli = np.fromiter(ledger.milli, np.int64, n)
        # owners are job ids or hold tags (non-empty strings) or None
        idle = ~np.frombuffer(bytes(map(bool, ledger.owner)), dtype=np.bool_)
        usable = idle & node_up[self._gpu_node]
        if ledger.blocked:
            usable[list(ledger.blocked)] = False
        flat = np.append(np.where(usable, MILLI_PER_GPU - milli, 0), 0)
        free = flat[self.gids]
        self._full_synced = True
        cpu = self._cpu_cap - np.fromiter(ledger.cpu_used, np.int64, len(node_up))[self.nodes]
        mem = self._mem_cap - np.fromiter(ledger.mem_used, np.int64, len(node_up))[self.nodes]
        up = node_up[self.nodes]
        diff = (
            (free != self.free).any(axis=1)
            | (cpu != self.cpu)
            | (mem != self.mem)
            | (up != self.up)
        )
        self.changed = np.flatnonzero(diff)
        if self.changed.size:
            self._clock += 1
            self.version[self.changed] = self._clock
        self.free, self.cpu, self.mem, self.up = free, cpu, mem, up
        self.max_free = int(free.max(initial=0))

    def _sync_rows(self, ledger: Ledger, nodes: set[int]) -> None:
        """Refresh only the rows of nodes the ledger touched since the last sync."""
        changed: list[int] = []
        width = self.gids.shape[1]
        pad = len(self.cluster.gpus)
        for n in sorted(nodes):
            r = self._row_of[n]
            up = ledger.node_up[n]
            row = [
                0
                if g == pad or not up or ledger.owner[g] is not None or g in ledger.blocked
                else MILLI_PER_GPU - ledger.milli[g]
                for g in self.gids[r].tolist()
            ]
            cpu = int(self._cpu_cap[r]) - ledger.cpu_used[n]
            mem = int(self._mem_cap[r]) - ledger.mem_used[n]
            if (
                row != self.free[r].tolist()
                or cpu != self.cpu[r]
                or mem != self.mem[r]
                or up != bool(self.up[r])
            ):
                self.free[r, :width] = row
                self.cpu[r], self.mem[r], self.up[r] = cpu, mem, up
                changed.append(r)
        self.changed = np.array(changed, dtype=np.int64)
        if changed:
            self._clock += 1
            self.version[self.changed] = self._clock
            self.max_free = int(self.free.max(initial=0))

    def gpu_mem_free(self, ledger: Ledger) -> IntArr:
        """(N, G) free GPU memory per slot (0 for padding); reads only this pool's GPUs."""
        if self._gmem_cap is None:  # per-GPU memory never changes: read the types once
            c = self.cluster
            cap = np.array([c.gpu_type_of(g.gid).memory_mib for g in c.gpus] + [0])
            self._gmem_cap = cap[self.gids]
            flat = self.gids.ravel()
            self._gmem_slots = np.flatnonzero(flat != len(c.gpus))
            self._gmem_gids = flat[self._gmem_slots].tolist()
        # (read-only to callers: gangs copy it; only a change on this pool's nodes moves it)
        at = ledger.pool_version[self.pool]
        if self._gmem_at == at:
            return self._gmem
        gmem = ledger.gmem
        used = np.zeros(self.gids.size, dtype=np.int64)
        used[self._gmem_slots] = [gmem[g] for g in self._gmem_gids]
        out: IntArr = self._gmem_cap - used.reshape(self.gids.shape)
        self._gmem, self._gmem_at = out, at
        return out

    def most_free(self, ledger: Ledger) -> tuple[int, int]:
        """The most GPU memory free on one GPU and host memory on one node, over the up nodes
        (what a failure's reason quotes; recomputed only after the ledger changed)."""
        at = ledger.pool_version[self.pool]
        if self._most[0] != at:
            up = self.up
            gmem = int(self.gpu_mem_free(ledger)[up].max(initial=0))
            self._most = (at, gmem, int(self.mem[up].max(initial=0)))
        return self._most[1], self._most[2]

    def totals(self) -> tuple[int, int]:
        """Free milli-GPU and CPU over the up nodes (recounted only after a change)."""
        if self._totals[0] != self._clock:
            up = self.up
            self._totals = (self._clock, int(self.free[up].sum()), int(self.cpu[up].sum()))
        return self._totals[1], self._totals[2]

    def scores(self, scorer: Scorer, key: tuple[object, ...]) -> _Scores:
        full = (id(scorer), scorer.version(), *key)
        got = self.cache.get(full)
        if got is None:
            n = len(self.nodes)
            got = _Scores(np.full(n, -1, np.int64), np.zeros(n), np.zeros(n, np.int64))
            self.cache[full] = got
            if len(self.cache) > CACHE_SHAPES:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(full)
        return got


_INDEXES: weakref.WeakKeyDictionary[Ledger, dict[str, PoolIndex]] = weakref.WeakKeyDictionary()


def pool_index(ledger: Ledger, pool: str) -> PoolIndex:
    """The synced array view of ``pool`` (one per ledger and pool, reused across calls)."""
    per = _INDEXES.setdefault(ledger, {})
    idx = per.get(pool)
    if idx is None or idx.cluster is not ledger.cluster:
        idx = per[pool] = PoolIndex(ledger.cluster, pool)
    idx.sync(ledger)
    return idx


@dataclass(slots=True)
class _State:
    """A (possibly gang-modified) copy of the arrays a placement decides on."""

    free: IntArr
    cpu: IntArr
    mem: IntArr
    gmem: IntArr | None


def place_fractional(ledger: Ledger, job: Job, pool: str, scorer: Scorer) -> PlaceResult:
    idx = pool_index(ledger, pool)
    req = job.request
    # O(1) rejection before any array work: no GPU has this much left
    if req.kind is RequestKind.FRACTION and idx.max_free < req.milli:
        return _why(idx, ledger, job, pool)
    pod = PodSpec.of(job)
    gmem = idx.gpu_mem_free(ledger) if req.gpu_mem_mib > 0 else None
    st = _State(idx.free, idx.cpu, idx.mem, gmem)
    # cached scores are valid only for unmodified arrays: single replicas, no GPU memory
    use_cache = scorer.cacheable and job.replicas == 1 and gmem is None
    key = (pod, req.gpu_mem_mib)
    out: list[Assignment] = []
    for _ in range(job.replicas):
        rows, fit = _feasible(idx, st, job, pod)
        if rows.size == 0:
            return _why(idx, ledger, job, pool)
        if use_cache:
            sc = idx.scores(scorer, key)
            stale = rows[sc.version[rows] != idx.version[rows]]
            if stale.size:
                s, col = scorer.score(_candidates(idx, st, stale, fit[stale], pod))
                sc.score[stale], sc.col[stale], sc.version[stale] = s, col, idx.version[stale]
            score, cols = sc.score[rows], sc.col[rows]
        else:
            score, cols = scorer.score(_candidates(idx, st, rows, fit[rows], pod))
        at = scorer.pick(score, idx.nodes[rows])
        row = int(rows[at])
        a = _assignment(ledger, idx, st, row, int(cols[at]), fit[row], job)
        out.append(a)
        if job.replicas > 1:
            st = _apply(idx, st, row, a, job)
    return Placed(tuple(out))


def _feasible(idx: PoolIndex, st: _State, job: Job, pod: PodSpec) -> tuple[IntArr, BoolArr]:
    """Rows where one replica fits, and per row the GPU columns it fits on (sharing pod) or the
    columns it would take (whole GPUs: the lowest free ones; CPU-only: none)."""
    ok = idx.up & (st.cpu >= job.cpu_milli) & (st.mem >= job.mem_mib)
    if job.gpu_types:
        allowed = np.array([t in job.gpu_types for t in idx.types], dtype=np.bool_)
        ok &= allowed[idx.tid]
    if pod.sharing:
        fit = st.free >= pod.milli
        if st.gmem is not None:
            fit &= st.gmem >= job.request.gpu_mem_mib
        ok &= fit.any(axis=1)
    elif pod.gpus > 0:
        full = st.free == MILLI_PER_GPU
        fit = full & (np.cumsum(full, axis=1) <= pod.gpus)
        ok &= full.sum(axis=1) >= pod.gpus
    else:
        fit = np.zeros_like(st.free, dtype=np.bool_)
    return np.flatnonzero(ok), fit


def _candidates(idx: PoolIndex, st: _State, rows: IntArr, fit: BoolArr, pod: PodSpec) -> Candidates:
    return Candidates(
        free=st.free[rows],
        cpu=st.cpu[rows],
        mem=st.mem[rows],
        tid=idx.tid[rows],
        types=idx.types,
        pod=pod,
        fit=fit,
        cpu_cap=idx.cpu_cap,
        mem_cap=idx.mem_cap,
        gpu_cap=idx.gpu_cap,
    )


def _assignment(
    ledger: Ledger, idx: PoolIndex, st: _State, row: int, col: int, fit: BoolArr, job: Job
) -> Assignment:
    node = int(idx.nodes[row])
    req = job.request
    if req.kind is RequestKind.FRACTION:
        if col < 0 or not fit[col]:  # the scorer gave no usable column: tightest that fits
            col = int(np.where(fit, st.free[row], np.iinfo(np.int64).max).argmin())
        return Assignment(node, (int(idx.gids[row, col]),), req.milli, req.gpu_mem_mib)
    if req.gpus == 0:
        return Assignment(node, ())
    full = [int(g) for g, f in zip(idx.gids[row], st.free[row], strict=True) if f == MILLI_PER_GPU]
    return Assignment(node, tuple(pick_gpus(ledger, node, full, req.gpus)))


def _apply(idx: PoolIndex, st: _State, row: int, a: Assignment, job: Job) -> _State:
    """The arrays after one replica of a gang took ``a`` (later replicas see it)."""
    free, cpu, mem = st.free.copy(), st.cpu.copy(), st.mem.copy()
    gmem = None if st.gmem is None else st.gmem.copy()
    for g in a.gpus:
        col = int(np.flatnonzero(idx.gids[row] == g)[0])
        free[row, col] -= a.milli if job.request.kind is RequestKind.FRACTION else MILLI_PER_GPU
        if gmem is not None:
            gmem[row, col] -= a.gpu_mem_mib
    cpu[row] -= job.cpu_milli
    mem[row] -= job.mem_mib
    return _State(free, cpu, mem, gmem)


def _why(idx: PoolIndex, ledger: Ledger, job: Job, pool: str) -> NotPlaced:
    """What the pool lacks: GPU or host memory on any one GPU or node (no-fit), capacity in
    aggregate (no-fit), or only a place where it is all together (fragmented)."""
    req = job.request
    most_gmem, most_mem = idx.most_free(ledger)
    if req.gpu_mem_mib > 0:
        most = most_gmem
        if most < req.gpu_mem_mib:
            return NotPlaced(
                Reason.NO_FIT,
                f"needs {req.gpu_mem_mib} MiB of GPU memory on one GPU; the most free on a "
                f"GPU of {pool} is {most} MiB",
            )
    if job.mem_mib > 0:
        most = most_mem
        if most < job.mem_mib:
            return NotPlaced(
                Reason.NO_FIT,
                f"needs {job.mem_mib} MiB of host memory; the most free on a node of {pool} "
                f"is {most} MiB",
            )
    free, cpu = idx.totals()
    want = (req.milli if req.kind is RequestKind.FRACTION else MILLI_PER_GPU * req.gpus) * (
        job.replicas
    )
    want_cpu = job.cpu_milli * job.replicas
    if free >= want and cpu >= want_cpu:
        return NotPlaced(
            Reason.FRAGMENTED,
            f"{free / 1000:g} GPUs free in {pool}, but no GPU fits {req.describe()}",
        )
    # only what is short is named: "0.1 GPUs and 64 CPUs free" for a GPU share that asked
    # for no CPU read as if the CPUs were the blocker
    short = []
    if free < want:
        short.append(f"needs {want / 1000:g} GPUs, {free / 1000:g} free")
    if cpu < want_cpu:
        short.append(f"needs {want_cpu / 1000:g} CPUs, {cpu / 1000:g} free on its nodes")
    return NotPlaced(Reason.NO_FIT, f"{pool} has no room for {req.describe()}: {'; '.join(short)}")


class FractionalPlacer:
    """Fractional partitions: milli-GPU shares, whole GPUs and CPU-only replicas, placed where
    the partition's scorer (``placement: best-fit | fgd | ...``) says."""

    offers = frozenset({RequestKind.WHOLE, RequestKind.FRACTION})

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer

    def place(self, ledger: Ledger, job: Job, pool: str) -> PlaceResult:
        return place_fractional(ledger, job, pool, self.scorer)
