"""Allocation ledger: who holds which GPU, MIG slot, milli-GPU and CPU; indexes; fork/commit.

Every state change goes through a handful of primitives. Each primitive keeps the free-capacity
indexes up to date and, while a transaction is open, records its inverse, so a what-if (a gang
placement, a preemption victim search, a backfill reservation) is ``mark = ledger.mark()`` ...
``ledger.rollback(mark)`` in O(changes). ``state.invariants.check(ledger)`` recomputes everything
from the allocation records and reports each broken invariant; tests run it after every step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache

from gpufence.model import mig as migmod
from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Assignment
from gpufence.model.job import MILLI_PER_GPU, Job, RequestKind
from gpufence.model.partition import SharingMode

HOLD_PREFIX = "@hold:"  # pseudo-owner of GPUs reserved for a waiting gang
_LOG_MAX = 200_000  # entries a change log keeps before it is cut (views then resync in full)


@dataclass(frozen=True, slots=True)
class Allocation:
    job: Job
    home: str  # the job's own partition
    queue: str  # the job's resolved queue
    pool: str  # the partition whose GPUs it occupies
    assignments: tuple[Assignment, ...]
    charge_milli: int  # GPU-equivalents charged to quota and fair share
    lent_from: str | None = None  # pool lent it capacity under a lending rule
    incident: bool = False  # placed on capacity freed by incident preemption

    def gpu_ids(self) -> Iterator[int]:
        for a in self.assignments:
            yield from a.gpus


@dataclass(slots=True)
class MigGpu:
    """MIG state of one GPU: its GPU instances and who occupies each."""

    instances: list[migmod.MigInstance]
    occupant: list[str | None]
    busy_count: int = 0  # instances with a job on them
    # what placement derived from this GPU's instances (e.g. the best free instance per
    # profile); emptied whenever its instances or their occupants change
    memo: dict[object, object] = field(default_factory=dict)

    def busy(self) -> bool:
        return self.busy_count > 0


class Ledger:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        n_gpus = len(cluster.gpus)
        n_nodes = len(cluster.nodes)
        self.owner: list[str | None] = [None] * n_gpus  # exclusive holder (or a hold)
        self.milli: list[int] = [0] * n_gpus  # fractional shares in use
        self.gmem: list[int] = [0] * n_gpus  # GPU memory (MiB) of fractional shares
        self.shares: list[dict[str, int]] = [{} for _ in range(n_gpus)]
        self.ts: list[list[str]] = [[] for _ in range(n_gpus)]  # time-slice occupants
        self.mig: dict[int, MigGpu] = {}
        # (pool, profile) -> GPU -> free instances of that profile on it (MIG placement index)
        self.mig_free: dict[tuple[str, str], dict[int, int]] = {}
        self.mig_free_total: dict[str, int] = {}  # free instances per pool, any profile
        self.mig_free_count: dict[tuple[str, str], int] = {}  # (pool, profile) -> free ones
        # the same two counts on the blocked GPUs alone: a MIG job that finds no instance is
        # told how many usable ones there are without a scan of the blocked GPUs
        self.mig_free_blocked: dict[tuple[str, str], int] = {}
        self.mig_free_blocked_total: dict[str, int] = {}
        self.nodes_down = 0
        self.blocked: dict[int, None] = {}  # GPUs being MIG re-partitioned
        self.cpu_used: list[int] = [0] * n_nodes
        self.mem_used: list[int] = [0] * n_nodes
        self.node_up: list[bool] = [True] * n_nodes
        self.allocs: dict[str, Allocation] = {}
        # the same allocations by the pool they occupy (victim searches look at one pool)
        self.pool_allocs: dict[str, dict[str, None]] = {p: {} for p in cluster.partitions}
        self.pool_used: dict[str, int] = {p: 0 for p in cluster.partitions}  # milli by pool
        self.lent: dict[str, int] = {p: 0 for p in cluster.partitions}  # whole GPUs lent out
        # milli charged to quota: at home and on GPUs lent by another fence
        self.queue_used: dict[str, int] = {q: 0 for q in cluster.queues}
        # milli on incident capacity of a donor pool (not charged to quota; fair share counts it)
        self.queue_lent_used: dict[str, int] = {q: 0 for q in cluster.queues}
        # bumped whenever capacity comes back to a pool (a release, a node up, a MIG layout):
        # a queue that failed to fit cannot fit before it changes. A what-if release is undone
        # with the rest of its fork (readers compare values taken outside forks only).
        self.freed: dict[str, int] = {p: 0 for p in cluster.partitions}
        self._sharing = [cluster.partitions[g.partition].sharing for g in cluster.gpus]
        self._gpu_mem = [cluster.gpu_type_of(g.gid).memory_mib for g in cluster.gpus]
        # index: (pool, node) -> number of GPUs that are entirely free; buckets by that number
        self.free_count: dict[tuple[str, int], int] = {}
        self.buckets: dict[str, list[dict[int, None]]] = {}
        self.pool_free: dict[str, int] = {p: 0 for p in cluster.partitions}
        self.pool_held: dict[str, int] = {p: 0 for p in cluster.partitions}  # GPUs on hold
        self._held: dict[str, dict[str, set[int]]] = {}  # pool -> hold tag -> its GPUs
        self._undo: list[Callable[[], None]] | None = None
        self.version = 0  # bumped by every change of GPU or node state (caches key on it)
        # per pool: bumped by every change on a node hosting GPUs of that pool, so a cache of one
        # pool's placements survives what happens in the others
        self.pool_version: dict[str, int] = dict.fromkeys(cluster.partitions, 0)
        # what placement derives from the ledger and keeps current itself from ``node_log``
        # (e.g. sched/placement/mig_rank.py's ranking of free MIG instances)
        self.derived: dict[object, object] = {}
        pools_on: list[dict[str, None]] = [{} for _ in range(n_nodes)]
        for p, node in cluster.node_partition_gpus:
            pools_on[node][p] = None
        self._node_pools: list[tuple[str, ...]] = [tuple(d) for d in pools_on]
        # nodes touched, in order, so array views can refresh only what changed
        self.node_log: list[int] = []
        # MIG GPUs whose instances, occupants or usability changed, in order: views of MIG
        # instances refresh only those (a node is logged for its CPU and memory too, and for
        # any of its GPUs)
        self.mig_log: list[int] = []
        self.log_epoch = 0  # bumped when the logs are cut short: views then resync in full
        self._node_of = [g.node for g in cluster.gpus]
        self._depth = 0  # open transactions
        self._init_indexes()
        self._init_mig()

    # ------------------------------------------------------------------ setup
    def _init_indexes(self) -> None:
        c = self.cluster
        for p in c.partitions:
            self.buckets[p] = [{} for _ in range(c.max_gpus_per_node(p) + 1)]
        for (p, node), gids in c.node_partition_gpus.items():
            free = sum(1 for g in gids if self._is_free(g))
            self.free_count[(p, node)] = free
            self.buckets[p][free][node] = None
            self.pool_free[p] += free

    def _init_mig(self) -> None:
        for g in self.cluster.gpus:
            part = self.cluster.partitions[g.partition]
            if part.sharing is not SharingMode.MIG:
                continue
            gt = self.cluster.gpu_types[g.gpu_type]
            assert gt.mig_model is not None, "spec validation guarantees MIG-capable GPUs"
            layout = (
                migmod.plan_layout(migmod.profiles_for(gt.mig_model), part.mig.layout)
                if part.mig is not None and part.mig.layout
                else ()
            )
            self.mig[g.gid] = MigGpu(list(layout), [None] * len(layout))
            self._index_mig(g.gid, +1)

    def _index_mig(self, g: int, sign: int) -> None:
        """Add (+1) or remove (-1) GPU ``g``'s free instances in the per-profile index."""
        st = self.mig[g]
        pool = self.cluster.gpus[g].partition
        for inst, occ in zip(st.instances, st.occupant, strict=True):
            if occ is None:
                self._mig_count(pool, inst.profile, g, sign)

    def _mig_count(self, pool: str, profile: str, g: int, delta: int) -> None:
        self.mig_free_total[pool] = self.mig_free_total.get(pool, 0) + delta
        key = (pool, profile)
        self.mig_free_count[key] = self.mig_free_count.get(key, 0) + delta
        if g in self.blocked:
            self._blocked_count(pool, profile, delta)
        per = self.mig_free.setdefault((pool, profile), {})
        n = per.get(g, 0) + delta
        if n:
            per[g] = n
        else:
            per.pop(g, None)

    def _blocked_count(self, pool: str, profile: str, delta: int) -> None:
        key = (pool, profile)
        self.mig_free_blocked[key] = self.mig_free_blocked.get(key, 0) + delta
        self.mig_free_blocked_total[pool] = self.mig_free_blocked_total.get(pool, 0) + delta

    # ------------------------------------------------------------------ queries
    def _is_free(self, g: int) -> bool:
        """Entirely free: usable as a whole GPU (never true for MIG-mode GPUs)."""
        return (
            self.owner[g] is None
            and self.milli[g] == 0
            and not self.ts[g]
            and self._sharing[g] is not SharingMode.MIG
            and g not in self.blocked
            and self.node_up[self.cluster.gpus[g].node]
        )

    def is_free(self, g: int) -> bool:
        return self._is_free(g)

    def free_gpus(self, pool: str, node: int) -> list[int]:
        return [g for g in self.cluster.node_partition_gpus[(pool, node)] if self._is_free(g)]

    def node_pools(self, node: int) -> tuple[str, ...]:
        """The pools with GPUs on ``node``."""
        return self._node_pools[node]

    def gpu_usable(self, g: int) -> bool:
        return g not in self.blocked and self.node_up[self.cluster.gpus[g].node]

    def cpu_free(self, node: int) -> int:
        return self.cluster.nodes[node].cpu_milli - self.cpu_used[node]

    def mem_free(self, node: int) -> int:
        return self.cluster.nodes[node].mem_mib - self.mem_used[node]

    def gpu_mem_free(self, g: int) -> int:
        return self._gpu_mem[g] - self.gmem[g]

    def colocated(self, g: int) -> tuple[str, ...]:
        """Jobs sharing GPU ``g`` in time (time-slice) or space (fractional shares)."""
        return tuple(self.ts[g]) + tuple(self.shares[g])

    def jobs_on_node(self, node: int) -> list[str]:
        return [jid for jid, a in self.allocs.items() if any(s.node == node for s in a.assignments)]

    # ------------------------------------------------------------------ transactions
    def mark(self) -> int:
        """Open a (possibly nested) transaction; close it with ``commit`` or ``rollback``."""
        if self._undo is None:
            self._undo = []
        self._depth += 1
        return len(self._undo)

    def rollback(self, mark: int) -> None:
        """Undo everything since ``mark`` and close that transaction."""
        undo = self._undo
        assert undo is not None and self._depth > 0
        self._undo = None  # inverses must not record inverses of their own
        try:
            while len(undo) > mark:
                undo.pop()()
        finally:
            self._undo = undo
            self._close()

    def commit(self, mark: int) -> None:
        """Keep the changes since ``mark`` (an enclosing transaction may still undo them)."""
        assert self._undo is not None and self._depth > 0 and len(self._undo) >= mark
        self._close()

    def _close(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._undo = None

    @contextmanager
    def fork(self) -> Iterator[int]:
        """What-if block: everything done inside is undone on exit."""
        m = self.mark()
        try:
            yield m
        finally:
            self.rollback(m)

    def _touch(self, node: int) -> None:
        pv = self.pool_version
        for p in self._node_pools[node]:
            pv[p] += 1
        log = self.node_log
        log.append(node)
        if len(log) > _LOG_MAX:
            self._cut_logs()

    def _log_mig(self, g: int) -> None:
        if g in self.mig:
            log = self.mig_log
            log.append(g)
            if len(log) > _LOG_MAX:
                self._cut_logs()

    def _cut_logs(self) -> None:
        self.node_log.clear()
        self.mig_log.clear()
        self.log_epoch += 1

    # ------------------------------------------------------------------ primitives
    def _reindex(self, g: int, was_free: bool) -> None:
        now_free = self._is_free(g)
        if now_free == was_free:
            return
        gpu = self.cluster.gpus[g]
        key = (gpu.partition, gpu.node)
        old = self.free_count[key]
        new = old + (1 if now_free else -1)
        self.free_count[key] = new
        b = self.buckets[gpu.partition]
        del b[old][gpu.node]
        b[new][gpu.node] = None
        self.pool_free[gpu.partition] += new - old

    def _changed(self, node: int) -> None:
        """Every primitive starts here: caches keyed on the ledger or a pool version go stale."""
        self.version += 1
        self._touch(node)

    def _set_owner(self, g: int, owner: str | None) -> None:
        self._changed(self._node_of[g])
        prev = self.owner[g]
        was = self._is_free(g)
        self.owner[g] = owner
        self._reindex(g, was)
        if self._undo is not None:  # only inside a transaction
            self._undo.append(lambda: self._set_owner(g, prev))

    def _share(self, g: int, job: str, milli: int, mem: int) -> None:
        """Add (milli > 0) or take back (milli < 0) a fractional share of GPU ``g``."""
        self._changed(self._node_of[g])
        was = self._is_free(g)
        self.milli[g] += milli
        self.gmem[g] += mem
        # a multi-replica gang may put several replicas on one GPU: shares accumulate
        left = self.shares[g].get(job, 0) + milli
        if left:
            self.shares[g][job] = left
        else:
            del self.shares[g][job]
        self._reindex(g, was)
        if self._undo is not None:  # only inside a transaction
            self._undo.append(lambda: self._share(g, job, -milli, -mem))

    def _time_slice(self, g: int, job: str, join: bool) -> None:
        """``job`` joins (or leaves) the time-slice occupants of GPU ``g``."""
        self._changed(self._node_of[g])
        was = self._is_free(g)
        if join:
            self.ts[g].append(job)
        else:
            self.ts[g].remove(job)
        self._reindex(g, was)
        if self._undo is not None:  # only inside a transaction
            self._undo.append(lambda: self._time_slice(g, job, not join))

    def _mig_occupy(self, g: int, idx: int, job: str | None) -> None:
        self._changed(self._node_of[g])
        self._log_mig(g)
        st = self.mig[g]
        prev = st.occupant[idx]
        st.occupant[idx] = job
        st.memo.clear()
        if (prev is None) != (job is None):
            st.busy_count += 1 if job is not None else -1
            pool = self.cluster.gpus[g].partition
            self._mig_count(pool, st.instances[idx].profile, g, -1 if job is not None else 1)
        if self._undo is not None:  # only inside a transaction
            self._undo.append(lambda: self._mig_occupy(g, idx, prev))

    def _node_res(self, node: int, cpu: int, mem: int) -> None:
        self._changed(node)
        self.cpu_used[node] += cpu
        self.mem_used[node] += mem
        if self._undo is not None:  # only inside a transaction
            self._undo.append(lambda: self._node_res(node, -cpu, -mem))

    def _counter(self, table: dict[str, int], key: str, delta: int) -> None:
        table[key] += delta
        if self._undo is not None:  # only inside a transaction
            self._undo.append(lambda: self._counter(table, key, -delta))

    def _set_alloc(self, job_id: str, alloc: Allocation | None) -> None:
        prev = self.allocs.get(job_id)
        # (mirrors ``allocs`` exactly, order included: a pool's jobs iterate as in ``allocs``)
        if prev is not None and (alloc is None or alloc.pool != prev.pool):
            del self.pool_allocs[prev.pool][job_id]
        if alloc is None:
            del self.allocs[job_id]
        else:
            self.allocs[job_id] = alloc
            self.pool_allocs[alloc.pool][job_id] = None
        if self._undo is not None:  # only inside a transaction
            self._undo.append(lambda: self._set_alloc(job_id, prev))

    def set_node_up(self, node: int, up: bool, count: bool = True) -> None:
        """``count`` False: a what-if toggle (a placement in a fork) that must not tell the
        queues capacity came back when it is undone."""
        self._changed(node)
        if up and count:
            self.capacity_back()
        prev = self.node_up[node]
        if prev != up:
            self.nodes_down += -1 if up else 1
        gids = list(self.cluster.nodes[node].gpu_ids)  # (toggled per placement by closures)
        for g in gids:
            self._log_mig(g)
        was = [self._is_free(g) for g in gids]
        self.node_up[node] = up
        for g, w in zip(gids, was, strict=True):
            self._reindex(g, w)
        if self._undo is not None:  # only inside a transaction
            self._undo.append(lambda: self.set_node_up(node, prev, count))

    def capacity_back(self) -> None:
        """Tell every partition's queue that what failed to fit may fit now (a node came back,
        a maintenance window was called off)."""
        for p in self.cluster.partitions:
            self.freed[p] += 1

    def set_blocked(self, g: int, blocked: bool) -> None:
        self._changed(self._node_of[g])
        self._log_mig(g)
        self.freed[self.cluster.gpus[g].partition] += 1
        was = self._is_free(g)
        prev = g in self.blocked
        st = self.mig.get(g)
        if st is not None and prev != blocked:  # its free instances count as blocked, or not
            pool = self.cluster.gpus[g].partition
            for inst, occ in zip(st.instances, st.occupant, strict=True):
                if occ is None:
                    self._blocked_count(pool, inst.profile, 1 if blocked else -1)
        if blocked:
            self.blocked[g] = None
        else:
            self.blocked.pop(g, None)
        self._reindex(g, was)
        if self._undo is not None:  # only inside a transaction
            self._undo.append(lambda: self.set_blocked(g, prev))

    def set_mig_layout(self, g: int, instances: Iterable[migmod.MigInstance]) -> None:
        self._changed(self._node_of[g])
        self._log_mig(g)
        self.freed[self.cluster.gpus[g].partition] += 1
        st = self.mig[g]
        prev = list(st.instances)
        new = list(instances)
        # a re-cut around running instances keeps them where they are, with their jobs: the
        # hardware only destroys and creates the idle ones (control/gpus/mig_device.py)
        held = {i: occ for i, occ in zip(st.instances, st.occupant, strict=True) if occ}
        assert set(held) <= set(new), "a MIG re-cut never drops an instance under a job"
        self._index_mig(g, -1)
        st.instances = new
        st.occupant = [held.get(i) for i in new]
        st.memo.clear()
        self._index_mig(g, +1)
        if self._undo is not None:  # only inside a transaction
            self._undo.append(lambda: self.set_mig_layout(g, prev))

    # ------------------------------------------------------------------ holds
    def hold(self, g: int, tag: str) -> None:
        self._set_owner(g, HOLD_PREFIX + tag)
        pool = self.cluster.gpus[g].partition
        self._counter(self.pool_held, pool, 1)
        self._index_hold(pool, tag, g, True)

    def unhold(self, g: int) -> None:
        owner = self.owner[g]
        assert owner is not None and owner.startswith(HOLD_PREFIX)
        self._set_owner(g, None)
        pool = self.cluster.gpus[g].partition
        self._counter(self.pool_held, pool, -1)
        self._index_hold(pool, owner[len(HOLD_PREFIX) :], g, False)

    def _index_hold(self, pool: str, tag: str, g: int, add: bool) -> None:
        per = self._held.setdefault(pool, {})
        if add:
            per.setdefault(tag, set()).add(g)
        else:
            gids = per[tag]
            gids.discard(g)
            if not gids:
                del per[tag]
        if self._undo is not None:  # only inside a transaction
            self._undo.append(lambda: self._index_hold(pool, tag, g, not add))

    def holders(self, pool: str) -> dict[str, int]:
        """Who the GPUs on hold in ``pool`` are held for, and how many, in the order of their
        lowest GPU id (what a scan of the pool would find first)."""
        per = self._held.get(pool)
        if not per:
            return {}
        return {tag: len(per[tag]) for tag in sorted(per, key=lambda t: min(per[t]))}

    # ------------------------------------------------------------------ allocate / release
    def allocate(self, alloc: Allocation) -> None:
        self._book(alloc, +1)

    def release(self, job_id: str) -> Allocation:
        alloc = self.allocs[job_id]
        self._counter(self.freed, alloc.pool, 1)
        self._book(alloc, -1)
        return alloc

    def _book(self, alloc: Allocation, sign: int) -> None:
        """Take (+1) or give back (-1) everything ``alloc`` holds, in the same order both ways."""
        job = alloc.job
        jid = job.id
        fraction = job.request.kind is RequestKind.FRACTION
        for a in alloc.assignments:
            self._node_res(a.node, sign * job.cpu_milli, sign * job.mem_mib)
            if a.mig_profile is not None:
                st = self.mig[a.gpus[0]]
                idx = st.instances.index(migmod.MigInstance(a.mig_profile, a.mig_start or 0))
                self._mig_occupy(a.gpus[0], idx, jid if sign > 0 else None)
            elif a.time_sliced:
                for g in a.gpus:
                    self._time_slice(g, jid, sign > 0)
            elif fraction:
                self._share(a.gpus[0], jid, sign * a.milli, sign * a.gpu_mem_mib)
            else:
                for g in a.gpus:
                    self._set_owner(g, jid if sign > 0 else None)
        charge = sign * alloc.charge_milli
        self._counter(self.pool_used, alloc.pool, charge)
        if alloc.lent_from is not None:
            # lent GPUs count against the borrower's quota (lending is gated by it too):
            # lending stays inside quota, whichever phase placed the job
            self._counter(self.lent, alloc.lent_from, sign * job.total_gpus)
            self._counter(self.queue_used, alloc.queue, charge)
        elif not alloc.incident:
            self._counter(self.queue_used, alloc.queue, charge)
        else:
            self._counter(self.queue_lent_used, alloc.queue, charge)
        self._set_alloc(jid, alloc if sign > 0 else None)


def charge_milli(job: Job, cluster: Cluster, pool: str) -> int:
    """GPU-equivalents (milli) a job is charged: whole GPUs 1000 each, MIG by compute slices."""
    req = job.request
    if req.kind is RequestKind.FRACTION:
        return req.milli * job.replicas
    if req.kind is RequestKind.MIG:
        assert req.mig_profile is not None
        model = cluster.partition_mig_model[pool]
        if model is None:
            return MILLI_PER_GPU * job.replicas
        return _profile_milli(model, req.mig_profile) * job.replicas
    return MILLI_PER_GPU * job.total_gpus


@cache
def _profile_milli(model: str, profile: str) -> int:
    # (charged for every job the walk decides: a MIG catalogue look-up each time showed)
    return migmod.compute_fraction(migmod.profile(model, profile))
