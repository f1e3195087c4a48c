"""Scoring plugins for shared (fractional) GPU placement: best-fit, fgd, fence-pack, random.

A candidate is one node plus the GPUs a replica would use there; a scorer returns a sort key
(lower is better). FGD follows the description in the USENIX ATC'23 paper "Beware of
Fragmentation" (see research/traces.md §2.2): a node's fragmentation with respect to a typical
pod is the idle GPU capacity that pod cannot use; the expected fragmentation weights typical pods
by frequency; place where the expected fragmentation grows least.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from gpufence.model.job import MILLI_PER_GPU, Job, RequestKind

TYPICAL_COVERAGE = 0.95  # typical pods = most frequent specs covering 95% of pods (FGD protocol)


@dataclass(frozen=True, slots=True)
class NodeView:
    """What a scorer may see of one node: free milli per GPU (in the pool) and host capacity."""

    node: int
    gpu_type: str
    free: tuple[int, ...]  # free milli per GPU, in local order
    cpu_free: int
    mem_free: int


@dataclass(frozen=True, slots=True)
class PodSpec:
    """A typical pod: its CPU, per-GPU milli and GPU count, and allowed GPU types."""

    cpu_milli: int
    milli: int  # per GPU; 1000 for whole GPUs
    gpus: int  # 0 for CPU-only pods
    gpu_types: tuple[str, ...] = ()

    @staticmethod
    def of(job: Job) -> PodSpec:
        req = job.request
        if req.kind is RequestKind.FRACTION:
            return PodSpec(job.cpu_milli, req.milli, 1, job.gpu_types)
        return PodSpec(job.cpu_milli, MILLI_PER_GPU, req.gpus, job.gpu_types)


class Scorer(Protocol):
    name: str

    def observe(self, job: Job) -> None: ...

    def score(self, view: NodeView, after: tuple[int, ...], job: Job) -> tuple[float, ...]: ...


class BestFit:
    """Tightest GPU, then tightest node: the classic bin-packing baseline."""

    name = "best-fit"

    def observe(self, job: Job) -> None:
        return None

    def score(self, view: NodeView, after: tuple[int, ...], job: Job) -> tuple[float, ...]:
        changed = [a for a, b in zip(after, view.free, strict=True) if a != b]
        return (float(sum(changed)), float(sum(after)), float(view.node))


class RandomFit:
    """Uniformly random among feasible candidates (seeded: deterministic for a seed)."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def observe(self, job: Job) -> None:
        return None

    def score(self, view: NodeView, after: tuple[int, ...], job: Job) -> tuple[float, ...]:
        return (self._rng.random(),)


class TypicalWorkload:
    """Frequency of pod specs seen so far; the typical set is refreshed as the count doubles."""

    def __init__(self) -> None:
        self.counts: Counter[PodSpec] = Counter()
        self._seen = 0
        self._next_refresh = 1
        self.dist: tuple[tuple[PodSpec, float], ...] = ()
        self.version = 0
        self._cpu_levels: list[int] = []

    def observe(self, spec: PodSpec) -> None:
        self.counts[spec] += 1
        self._seen += 1
        if self._seen >= self._next_refresh:
            self._next_refresh = max(self._seen * 2, self._seen + 1)
            self.set_counts(self.counts)

    def set_counts(self, counts: Counter[PodSpec]) -> None:
        """Fix the distribution (e.g. from a whole trace, as the FGD experiments do)."""
        total = sum(counts.values())
        ordered = sorted(counts.items(), key=lambda kv: (-kv[1], repr(kv[0])))
        kept: list[tuple[PodSpec, int]] = []
        covered = 0
        for spec, n in ordered:
            kept.append((spec, n))
            covered += n
            if covered >= TYPICAL_COVERAGE * total:
                break
        norm = sum(n for _, n in kept) or 1
        self.dist = tuple((s, n / norm) for s, n in kept)
        self._cpu_levels = sorted({s.cpu_milli for s, _ in self.dist})
        self.version += 1

    def cpu_level(self, cpu_free: int) -> int:
        return bisect_right(self._cpu_levels, cpu_free)


def pod_frag(free: tuple[int, ...], cpu_free: int, gpu_type: str, pod: PodSpec) -> int:
    """Idle GPU milli on a node that ``pod`` cannot use (FGD's per-task fragment)."""
    total = sum(free)
    if pod.gpus == 0:
        return total
    if (pod.gpu_types and gpu_type not in pod.gpu_types) or cpu_free < pod.cpu_milli:
        return total
    if pod.milli < MILLI_PER_GPU:
        if max(free, default=0) >= pod.milli:
            return sum(f for f in free if f < pod.milli)
        return total
    if sum(1 for f in free if f == MILLI_PER_GPU) >= pod.gpus:
        return sum(f for f in free if f < MILLI_PER_GPU)
    return total


class FragmentationGradient:
    """FGD: minimise the growth of expected fragmentation over the typical workload."""

    name = "fgd"

    def __init__(self, workload: TypicalWorkload | None = None) -> None:
        self.workload = workload or TypicalWorkload()
        self._cache: dict[tuple[tuple[int, ...], int, str], float] = {}
        self._version = -1

    def observe(self, job: Job) -> None:
        self.workload.observe(PodSpec.of(job))

    def node_frag(self, free: tuple[int, ...], cpu_free: int, gpu_type: str) -> float:
        wl = self.workload
        if wl.version != self._version:
            self._cache.clear()
            self._version = wl.version
        key = (tuple(sorted(free)), wl.cpu_level(cpu_free), gpu_type)
        hit = self._cache.get(key)
        if hit is None:
            hit = sum(p * pod_frag(free, cpu_free, gpu_type, s) for s, p in wl.dist)
            self._cache[key] = hit
        return hit

    def delta(self, view: NodeView, after: tuple[int, ...], job: Job) -> float:
        before = self.node_frag(view.free, view.cpu_free, view.gpu_type)
        now = self.node_frag(after, view.cpu_free - job.cpu_milli, view.gpu_type)
        return now - before

    def score(self, view: NodeView, after: tuple[int, ...], job: Job) -> tuple[float, ...]:
        return (self.delta(view, after, job), float(view.node))


class FencePack(FragmentationGradient):
    """gpufence's own policy: FGD's gradient, ties broken to keep whole GPUs and nodes whole.

    Among candidates whose fragmentation growth is equal (common: many GPUs look alike), prefer
    a GPU that is already shared, then the tightest GPU, then the node with the fewest idle
    whole GPUs, so untouched GPUs and nodes stay available for multi-GPU pods and gangs.
    """

    name = "fence-pack"

    def score(self, view: NodeView, after: tuple[int, ...], job: Job) -> tuple[float, ...]:
        d = round(self.delta(view, after, job), 3)
        opened = sum(
            1 for a, b in zip(after, view.free, strict=True) if b == MILLI_PER_GPU and a != b
        )
        left = sum(a for a, b in zip(after, view.free, strict=True) if a != b)
        whole_left = sum(1 for a in after if a == MILLI_PER_GPU)
        return (d, float(opened), float(left), float(whole_left), float(view.node))
