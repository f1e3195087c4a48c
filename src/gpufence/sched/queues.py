"""Pending jobs per queue, and their merge into one partition order (priority, then fair share)."""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Iterator

from gpufence.model.cluster import Cluster
from gpufence.sched.jobs import JobRecord

_Key = tuple[int, float, int, str]  # (-priority, submit time, arrival seq, job id)


class PendingQueues:
    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._lists: dict[str, list[_Key]] = {q: [] for q in cluster.queues}
        self._keys: dict[str, _Key] = {}
        self.records: dict[str, JobRecord] = {}
        self.shapes: dict[str, Counter[tuple[object, ...]]] = {
            p: Counter() for p in cluster.partitions
        }
        self._seq = 0

    def __len__(self) -> int:
        return len(self.records)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self.records

    def add(self, rec: JobRecord) -> None:
        self._seq += 1
        key = (-rec.job.priority, rec.job.submit_time, self._seq, rec.job.id)
        self._keys[rec.job.id] = key
        self.records[rec.job.id] = rec
        insort(self._lists[rec.queue], key)
        self.shapes[rec.home][self.shape_key(rec)] += 1

    def remove(self, job_id: str) -> JobRecord:
        rec = self.records.pop(job_id)
        key = self._keys.pop(job_id)
        lst = self._lists[rec.queue]
        del lst[bisect_left(lst, key)]
        shapes = self.shapes[rec.home]
        shape = self.shape_key(rec)
        shapes[shape] -= 1
        if shapes[shape] == 0:
            del shapes[shape]
        return rec

    @staticmethod
    def shape_key(rec: JobRecord) -> tuple[object, ...]:
        """Jobs with equal keys are interchangeable for admission and placement."""
        return (rec.queue, rec.job.priority, rec.job.shape())

    def count(self, partition: str) -> int:
        return sum(self.shapes[partition].values())

    def ordered(self, partition: str, share: Callable[[str], float]) -> Iterator[JobRecord]:
        """Jobs of a partition in scheduling order: highest priority first, then the queue with
        the lowest weighted share, then submission order. ``share`` is re-read after every job,
        so admissions made during the walk move their queue back."""
        heap: list[tuple[int, float, str, int]] = []
        for q in self._cluster.partition_queues[partition]:
            lst = self._lists[q]
            if lst:
                heap.append((lst[0][0], share(q), q, 0))
        heapq.heapify(heap)
        while heap:
            _, _, q, i = heapq.heappop(heap)
            lst = self._lists[q]
            if i >= len(lst):
                continue
            key = lst[i]
            rec = self.records.get(key[3])
            removed_before = rec is None
            if rec is not None:
                yield rec
            # the consumer may have removed this job (bound): the next one then sits at index i
            nxt = i if (key[3] not in self.records or removed_before) else i + 1
            if nxt < len(lst):
                heapq.heappush(heap, (lst[nxt][0], share(q), q, nxt))
