"""Pending jobs per queue and shape, walked in scheduling order (priority, then fair share).

Jobs of one queue with the same priority, request shape and estimate bucket fit (or fail to fit)
in exactly the same places, so a cycle walks *shape heads*: the first job of each shape. A shape
that fails is dropped for the rest of the cycle with all its jobs; a shape whose head is bound
offers its next job. A cycle over 10,000 pending jobs in a few hundred shapes therefore costs
O(shapes + binds), not O(jobs).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator

from gpufence.model.cluster import Cluster
from gpufence.sched.jobs import JobRecord

_Key = tuple[int, float, int, str]  # (-priority, submit time, arrival seq, job id)
ShapeKey = tuple[object, ...]


def shape_key(rec: JobRecord) -> ShapeKey:
    """Interchangeable jobs: same queue, priority and request, and a runtime estimate in the same
    power-of-two bucket (backfill decisions depend on it; jobs in one bucket are treated alike,
    which at worst forgoes a backfill, never delays a reserved gang)."""
    est = rec.job.est_runtime_s
    bucket = None if est is None else math.ceil(math.log2(max(est, 1.0)))
    return (rec.queue, rec.job.priority, rec.job.shape(), bucket)


class PendingQueues:
    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._keys: dict[str, _Key] = {}
        self._shape_of: dict[str, ShapeKey] = {}
        self._lists: dict[ShapeKey, list[_Key]] = {}  # per shape, in scheduling order
        self._queue_shapes: dict[str, dict[ShapeKey, None]] = {q: {} for q in cluster.queues}
        self.records: dict[str, JobRecord] = {}
        self.shapes: dict[str, dict[ShapeKey, None]] = {p: {} for p in cluster.partitions}
        self.added: dict[str, int] = dict.fromkeys(cluster.partitions, 0)  # arrivals counter
        self._seq = 0

    def __len__(self) -> int:
        return len(self.records)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self.records

    def add(self, rec: JobRecord) -> None:
        self._seq += 1
        key = (-rec.job.priority, rec.job.submit_time, self._seq, rec.job.id)
        sk = shape_key(rec)
        self._keys[rec.job.id] = key
        self._shape_of[rec.job.id] = sk
        self.records[rec.job.id] = rec
        lst = self._lists.setdefault(sk, [])
        insort(lst, key)
        self._queue_shapes[rec.queue][sk] = None
        self.shapes[rec.home][sk] = None
        self.added[rec.home] += 1

    def remove(self, job_id: str) -> JobRecord:
        rec = self.records.pop(job_id)
        key = self._keys.pop(job_id)
        sk = self._shape_of.pop(job_id)
        lst = self._lists[sk]
        del lst[bisect_left(lst, key)]
        if not lst:
            del self._lists[sk]
            del self._queue_shapes[rec.queue][sk]
            del self.shapes[rec.home][sk]
        return rec

    def shape_of(self, job_id: str) -> ShapeKey:
        return self._shape_of[job_id]

    def count(self, partition: str) -> int:
        return sum(len(self._lists[sk]) for sk in self.shapes[partition])

    def walk(self, partition: str, share: Callable[[str], float]) -> Walk:
        return Walk(self, partition, share)

    def ordered(self, partition: str, share: Callable[[str], float]) -> Iterator[JobRecord]:
        """Every job of a partition in scheduling order (for views and small batches; the
        placement pass uses ``walk``)."""
        w = self.walk(partition, share)
        while (rec := w.next()) is not None:
            yield rec
            if rec.job.id in self.records:
                w.skip()
            else:
                w.placed()


class Walk:
    """Shape heads of one partition in scheduling order. After each ``next()`` the caller says
    what became of the job: ``placed()`` (it left the queue), ``skip()`` (try the next job of
    its shape) or ``drop()`` (its whole shape is done for this walk)."""

    def __init__(self, pq: PendingQueues, partition: str, share: Callable[[str], float]) -> None:
        self._pq = pq
        self._share = share
        self._pos: dict[ShapeKey, int] = {}
        self._heads: dict[str, list[tuple[_Key, ShapeKey]]] = {}
        self._top: list[tuple[int, float, str]] = []
        self._cur: tuple[str, ShapeKey] | None = None
        for q in pq._cluster.partition_queues[partition]:
            heads = [(pq._lists[sk][0], sk) for sk in pq._queue_shapes[q]]
            if heads:
                heapq.heapify(heads)
                self._heads[q] = heads
                for _, sk in heads:
                    self._pos[sk] = 0
                heapq.heappush(self._top, (heads[0][0][0], share(q), q))

    def next(self) -> JobRecord | None:
        assert self._cur is None, "say what became of the previous job first"
        while self._top:
            _, _, q = heapq.heappop(self._top)
            heads = self._heads[q]
            if not heads:
                continue
            key, sk = heapq.heappop(heads)
            self._cur = (q, sk)
            return self._pq.records[key[3]]
        return None

    def placed(self) -> None:
        self._advance(step=0)  # the bound job left its list: the next one moved into its slot

    def skip(self) -> None:
        self._advance(step=1)

    def drop(self) -> None:
        assert self._cur is not None
        q, _ = self._cur
        self._cur = None
        self._requeue(q)

    def _advance(self, step: int) -> None:
        assert self._cur is not None
        q, sk = self._cur
        self._cur = None
        pos = self._pos[sk] + step
        self._pos[sk] = pos
        lst = self._pq._lists.get(sk)
        if lst is not None and pos < len(lst):
            heapq.heappush(self._heads[q], (lst[pos], sk))
        self._requeue(q)

    def _requeue(self, q: str) -> None:
        heads = self._heads[q]
        if heads:
            heapq.heappush(self._top, (heads[0][0][0], self._share(q), q))
