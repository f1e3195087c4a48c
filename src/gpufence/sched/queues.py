"""Pending jobs per queue and shape, walked in scheduling order: the partition's queue order
(``sched/ordering.py``: by default priority), then fair share, then submit time.

Jobs of one queue with the same priority, request shape and estimate bucket fit (or fail to fit)
in exactly the same places, so a cycle walks *shape heads*: the first job of each shape. A shape
that fails is dropped for the rest of the cycle with all its jobs; a shape whose head is bound
offers its next job. A cycle over 10,000 pending jobs in a few hundred shapes therefore costs
O(shapes + binds), not O(jobs).

Shapes are interned as small integers when a job arrives (hashing nested frozen dataclasses on
every lookup was a measurable share of a cycle), and every queue keeps a heap of its shapes'
heads up to date as jobs come and go, so a walk starts from a copy instead of a rebuild.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator

from gpufence.model.cluster import Cluster
from gpufence.model.job import WorkloadClass
from gpufence.sched.jobs import JobRecord
from gpufence.sched.ordering import PriorityFairShare, QueueOrder

_Key = tuple[int, float, int, str]  # (rank by the queue order, submit time, arrival seq, job id)
SORT_UP_TO = 2048  # ``ordered`` sorts a partition this small at once, else merges lazily
ShapeKey = int  # interned (queue, priority, request shape, estimate bucket)


def estimate_bucket(est: float | None) -> int | None:
    """Planned run times (time limit, else estimate) in one power-of-two bucket,
    (2^(b-1), 2^b], are treated alike."""
    return None if est is None else math.ceil(math.log2(max(est, 1.0)))


class PendingQueues:
    def __init__(self, cluster: Cluster, orders: dict[str, QueueOrder] | None = None) -> None:
        self._cluster = cluster
        # per home partition (default: priority, then fair share)
        self._orders = orders or dict.fromkeys(cluster.partitions, PriorityFairShare())
        self._keys: dict[str, _Key] = {}
        self._shape_of: dict[str, int] = {}
        self._ids: dict[tuple[object, ...], int] = {}  # interned shape keys
        self._bucket: list[int | None] = []  # estimate bucket per shape id
        self._prio: list[int] = []  # priority per shape id
        self._queue: list[str] = []  # queue per shape id
        self._gpus: list[int] = []  # GPUs per job (all replicas) per shape id
        self._serving: list[bool] = []  # serving jobs, per shape id
        self._request_ids: dict[tuple[object, ...], int] = {}  # interned request shapes
        self._request_of: dict[str, int] = {}
        self._lists: dict[int, list[_Key]] = {}  # per shape, in scheduling order
        self._heads: dict[str, list[tuple[_Key, int]]] = {q: [] for q in cluster.queues}
        self._queue_shapes: dict[str, dict[int, None]] = {q: {} for q in cluster.queues}
        self.records: dict[str, JobRecord] = {}
        # per home partition, in the same (arrival) order as ``records``
        self._by_home: dict[str, dict[str, JobRecord]] = {p: {} for p in cluster.partitions}
        self.shapes: dict[str, dict[int, None]] = {p: {} for p in cluster.partitions}
        self.added: dict[str, int] = dict.fromkeys(cluster.partitions, 0)  # arrivals counter
        self._seq = 0

    def __len__(self) -> int:
        return len(self.records)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self.records

    def _intern(self, rec: JobRecord) -> int:
        bucket = estimate_bucket(rec.job.planned_runtime_s)
        full = (rec.queue, rec.job.priority, rec.job.shape(), bucket)
        sid = self._ids.get(full)
        if sid is None:
            sid = self._ids[full] = len(self._bucket)
            self._bucket.append(bucket)
            self._prio.append(rec.job.priority)
            self._queue.append(rec.queue)
            self._gpus.append(rec.job.total_gpus)
            self._serving.append(rec.job.workload_class is WorkloadClass.SERVING)
        return sid

    def add(self, rec: JobRecord) -> None:
        if not rec.arrival:  # a first arrival (a requeued attempt is one again: _stopped)
            self._seq += 1
            rec.arrival = self._seq
        key = (self._orders[rec.home].rank(rec), rec.job.submit_time, rec.arrival, rec.job.id)
        sid = self._intern(rec)
        request = rec.job.shape()
        rid = self._request_ids.setdefault(request, len(self._request_ids))
        self._keys[rec.job.id] = key
        self._shape_of[rec.job.id] = sid
        self._request_of[rec.job.id] = rid
        self.records[rec.job.id] = rec
        self._by_home[rec.home][rec.job.id] = rec
        lst = self._lists.setdefault(sid, [])
        insort(lst, key)
        self._queue_shapes[rec.queue][sid] = None  # before a head push may rebuild the heap
        self.shapes[rec.home][sid] = None
        if lst[0] == key:  # a new head for this shape (stale entries are skipped lazily)
            self._push_head(rec.queue, key, sid)
        self.added[rec.home] += 1

    def remove(self, job_id: str) -> JobRecord:
        rec = self.records.pop(job_id)
        del self._by_home[rec.home][job_id]
        key = self._keys.pop(job_id)
        sid = self._shape_of.pop(job_id)
        del self._request_of[job_id]
        lst = self._lists[sid]
        i = bisect_left(lst, key)
        del lst[i]
        if not lst:
            del self._lists[sid]
            del self._queue_shapes[rec.queue][sid]
            del self.shapes[rec.home][sid]
        elif i == 0:
            self._push_head(rec.queue, lst[0], sid)
        return rec

    def _push_head(self, queue: str, key: _Key, sid: int) -> None:
        heads = self._heads[queue]
        heapq.heappush(heads, (key, sid))
        if len(heads) > 2 * len(self._queue_shapes[queue]) + 8:  # drop stale entries
            self._heads[queue] = [
                (lst[0], s) for s in self._queue_shapes[queue] if (lst := self._lists[s])
            ]
            heapq.heapify(self._heads[queue])

    def head_valid(self, key: _Key, sid: int) -> bool:
        lst = self._lists.get(sid)
        return lst is not None and lst[0] == key

    def of_home(self, partition: str) -> Iterator[JobRecord]:
        """Pending jobs of one home partition, in the order of ``records``."""
        return iter(self._by_home[partition].values())

    def shape_of(self, job_id: str) -> ShapeKey:
        return self._shape_of[job_id]

    def request_of(self, job_id: str) -> int:
        """Interned request shape (placement depends on nothing else of the job)."""
        return self._request_of[job_id]

    def bucket(self, sid: ShapeKey) -> int | None:
        return self._bucket[sid]

    def priority(self, sid: ShapeKey) -> int:
        return self._prio[sid]

    def queue(self, sid: ShapeKey) -> str:
        return self._queue[sid]

    def serving(self, sid: ShapeKey) -> bool:
        return self._serving[sid]

    def gpus(self, sid: ShapeKey) -> int:
        """GPUs a job of the shape takes in all (0: CPU-only replicas)."""
        return self._gpus[sid]

    def count(self, partition: str) -> int:
        return sum(len(self._lists[sk]) for sk in self.shapes[partition])

    def walk(self, partition: str, share: Callable[[str], float]) -> Walk:
        return Walk(self, partition, share)

    def ordered(self, partition: str, share: Callable[[str], float]) -> Iterator[JobRecord]:
        """Every job of a partition in the order a walk visits them when none binds: by the
        queue order's rank, then the queue's fair share (``share`` is asked once per queue),
        then the rest of the key. For views and protection's batches; the queues must not
        change while it is iterated (the placement pass uses ``walk``).

        A walk merges each queue's shapes by key (so a queue yields its jobs sorted by key)
        and the queues by (head's rank, share, name); merging those sorted streams here gives
        the same order without the walk's per-job heap upkeep."""
        per_queue = [
            (q, [self._lists[s] for s in shapes])
            for q in self._cluster.partition_queues[partition]
            if (shapes := self._queue_shapes[q])
        ]
        records = self.records
        total = sum(len(lst) for _, lists in per_queue for lst in lists)
        if total <= SORT_UP_TO:  # small: one sort in C beats a lazy merge in Python
            tagged: list[tuple[int, float, str, _Key]] = []
            for q, lists in per_queue:
                sh = share(q)
                for lst in lists:
                    tagged += [(k[0], sh, q, k) for k in lst]
            tagged.sort()
            for t in tagged:
                yield records[t[3][3]]
            return
        streams = [
            _tagged(iter(lists[0]) if len(lists) == 1 else heapq.merge(*lists), share(q), q)
            for q, lists in per_queue
        ]
        for _, _, _, key in heapq.merge(*streams):
            yield records[key[3]]


def _tagged(
    keys: Iterator[_Key], share: float, queue: str
) -> Iterator[tuple[int, float, str, _Key]]:
    for k in keys:
        yield (k[0], share, queue, k)


class Walk:
    """Shape heads of one partition in scheduling order. After each ``next()`` the caller says
    what became of the job: ``placed()`` (it left the queue), ``skip()`` (try the next job of
    its shape) or ``drop()`` (its whole shape is done for this walk)."""

    def __init__(self, pq: PendingQueues, partition: str, share: Callable[[str], float]) -> None:
        self._pq = pq
        self._share = share
        self._pos: dict[int, int] = {}  # shapes advanced past their head in this walk
        self._heads: dict[str, list[tuple[_Key, int]]] = {}
        self._top: list[tuple[int, float, str]] = []
        self._cur: tuple[str, int] | None = None
        # each queue's fair share as the walk last asked it: it changes only when a job binds
        # (the queue's use), and the walk hears of every bind (``placed``), which empties this
        self._shares: dict[str, float] = {}
        for q in pq._cluster.partition_queues[partition]:
            if not pq._queue_shapes[q]:
                continue
            base = pq._heads[q]
            while base and not pq.head_valid(*base[0]):  # stale tops: drop them for good
                heapq.heappop(base)
            heads = list(base)  # a heap already: copying keeps the heap property
            self._heads[q] = heads
            if self._clean(heads):
                sh = self._shares[q] = share(q)
                heapq.heappush(self._top, (heads[0][0][0], sh, q))

    def _clean(self, heads: list[tuple[_Key, int]]) -> bool:
        """Pop stale entries off the top; True when a valid head remains."""
        pq = self._pq
        while heads:
            key, sid = heads[0]
            pos = self._pos.get(sid, 0)
            lst = pq._lists.get(sid)
            if lst is not None and pos < len(lst) and lst[pos] == key:
                return True
            heapq.heappop(heads)
        return False

    def next(self) -> JobRecord | None:
        assert self._cur is None, "say what became of the previous job first"
        while self._top:
            _, _, q = heapq.heappop(self._top)
            heads = self._heads[q]
            if not self._clean(heads):
                continue
            key, sid = heapq.heappop(heads)
            self._cur = (q, sid)
            return self._pq.records[key[3]]
        return None

    def restrict(self, keep: Callable[[int], bool]) -> None:
        """From now on walk only the shapes ``keep`` accepts. Dropping a shape's heads from the
        heaps leaves the others in the same relative order: a queue's place in the walk depends
        only on its own head and its fair share, which is kept as the walk last computed it."""
        shares = {q: sh for _, sh, q in self._top}  # every queue with heads left but the current
        self._top = []
        for q, heads in self._heads.items():
            kept = [e for e in heads if keep(e[1])]
            heapq.heapify(kept)
            self._heads[q] = kept
            if q in shares and self._clean(kept):
                self._top.append((kept[0][0][0], shares[q], q))
        heapq.heapify(self._top)

    def placed(self) -> None:
        self._shares.clear()
        self._advance(step=0)  # the bound job left its list: the next one moved into its slot

    def skip(self) -> None:
        self._advance(step=1)

    def drop(self) -> None:
        assert self._cur is not None
        q, sid = self._cur
        self._cur = None
        self._pos[sid] = 1 << 30  # any entry of this shape is stale for the rest of the walk
        self._requeue(q)

    def _advance(self, step: int) -> None:
        assert self._cur is not None
        q, sid = self._cur
        self._cur = None
        pos = self._pos.get(sid, 0) + step
        self._pos[sid] = pos
        lst = self._pq._lists.get(sid)
        if lst is not None and pos < len(lst):
            heapq.heappush(self._heads[q], (lst[pos], sid))
        self._requeue(q)

    def _requeue(self, q: str) -> None:
        heads = self._heads[q]
        if self._clean(heads):
            sh = self._shares.get(q)
            if sh is None:
                sh = self._shares[q] = self._share(q)
            heapq.heappush(self._top, (heads[0][0][0], sh, q))
