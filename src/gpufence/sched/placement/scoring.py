"""Scoring plugins for shared (fractional) GPU placement: best-fit, random, fgd, fence-pack.

Scorers are vectorised: ``fractional.place_fractional`` hands a scorer the feasible nodes of a
pool as numpy arrays (``Candidates``: free milli-GPU per GPU column, free CPU, GPU type) and the
pod being placed; the scorer returns, per node, a score (higher is better) and for a sharing pod
the GPU column it would use. The placer picks the best node (``Scorer.pick`` breaks ties) and
caches scores per node until that node changes (``Scorer.cacheable``).

Fragmentation follows the FGD paper (Weng et al., "Beware of Fragmentation", USENIX ATC'23; the
protocol and the definitions are summarised in research/traces.md §2.2): the fragment of a node
with respect to one typical pod is the idle GPU capacity that pod cannot use -- all of it when
the pod cannot run there (no access to the GPU type, too little CPU, no GPU with room, a
CPU-only pod), otherwise the free milli of the GPUs too small for it; a node's fragmentation is
that amount in expectation over the typical pods (the most frequent pod specs covering 95% of
pods), and the cluster's is the sum over nodes.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from gpufence.model.job import MILLI_PER_GPU, Job, RequestKind

TYPICAL_COVERAGE = 0.95  # typical pods = most frequent specs covering 95% of pods (FGD protocol)
K8S_MAX_SCORE = 100  # Kubernetes score plugins return integers 0..100

IntArr = NDArray[np.int64]
FloatArr = NDArray[np.float64]
BoolArr = NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class PodSpec:
    """A pod's resource spec: CPU, per-GPU milli and GPU count, and allowed GPU types."""

    cpu_milli: int
    milli: int  # per GPU; 1000 for whole GPUs; 0 for CPU-only pods
    gpus: int  # 0 for CPU-only pods
    gpu_types: tuple[str, ...] = ()

    @staticmethod
    def of(job: Job) -> PodSpec:
        req = job.request
        if req.kind is RequestKind.FRACTION:
            return PodSpec(job.cpu_milli, req.milli, 1, job.gpu_types)
        if req.gpus == 0:
            return PodSpec(job.cpu_milli, 0, 0, job.gpu_types)
        return PodSpec(job.cpu_milli, MILLI_PER_GPU, req.gpus, job.gpu_types)

    @property
    def sharing(self) -> bool:
        return self.gpus == 1 and 0 < self.milli < MILLI_PER_GPU

    @property
    def total_milli(self) -> int:
        return self.milli * self.gpus


@dataclass(frozen=True, slots=True)
class Candidates:
    """The feasible nodes of a pool for one pod, as arrays with one row per node."""

    free: IntArr  # (r, G) free milli per GPU column; 0 for padding and unusable GPUs
    cpu: IntArr  # (r,) free CPU milli
    mem: IntArr  # (r,) free host memory MiB
    tid: IntArr  # (r,) GPU type id (index into ``types``)
    types: tuple[str, ...]
    pod: PodSpec
    fit: BoolArr  # (r, G) sharing pod: columns it fits on; otherwise: the columns it takes
    cpu_cap: int  # largest node CPU in the pool
    mem_cap: int  # largest node memory in the pool
    gpu_cap: int  # largest node GPU capacity (milli) in the pool

    def after(self) -> IntArr:
        """Free milli after placing the pod: (r, G, G) for a sharing pod (one state per GPU
        column it could use), (r, G) otherwise."""
        if self.pod.sharing:
            g = self.free.shape[1]
            return self.free[:, None, :] - self.pod.milli * np.eye(g, dtype=np.int64)[None]
        return np.where(self.fit, 0, self.free)


class Scorer(Protocol):
    name: str
    cacheable: bool  # a node's score changes only when the node or ``version()`` changes

    def observe(self, job: Job) -> None: ...

    def version(self) -> int: ...

    def score(self, c: Candidates) -> tuple[FloatArr, IntArr]:
        """Per row: score (higher is better) and, for a sharing pod, the GPU column (else -1)."""
        ...

    def pick(self, scores: FloatArr, nodes: IntArr) -> int:
        """Position of the chosen row among ``scores`` (all feasible)."""
        ...


class TypicalWorkload:
    """The typical pods: most frequent specs covering 95% of pods, with their probabilities.

    Fed by ``observe`` (refreshed each time the count doubles) unless fixed with ``set_counts``,
    as the FGD experiments do (the distribution of the whole trace, CPU-only pods included).
    """

    def __init__(self) -> None:
        self.counts: Counter[PodSpec] = Counter()
        self._seen = 0
        self._next_refresh = 1
        self.fixed = False
        self.dist: tuple[tuple[PodSpec, float], ...] = ()
        self.cpu_per_milli = 0.0  # typical GPU pods' CPU milli per GPU milli (0: none yet)
        self.version = 0
        self._compiled: dict[tuple[str, ...], _Compiled] = {}

    def observe(self, spec: PodSpec) -> None:
        if self.fixed:
            return
        self.counts[spec] += 1
        self._seen += 1
        if self._seen >= self._next_refresh:
            self._next_refresh = max(self._seen * 2, self._seen + 1)
            self._set(self.counts)

    def set_counts(self, counts: Counter[PodSpec]) -> None:
        """Fix the distribution (from a whole trace); later observations no longer change it."""
        self.fixed = True
        self.counts = Counter(counts)
        self._set(self.counts)

    def _set(self, counts: Counter[PodSpec]) -> None:
        total = sum(counts.values())
        # most frequent first; equal counts: larger spec first (as the FGD simulator orders them)
        ordered = sorted(
            counts.items(),
            key=lambda kv: (-kv[1], -kv[0].cpu_milli, -kv[0].milli, -kv[0].gpus, kv[0].gpu_types),
        )
        kept: list[tuple[PodSpec, int]] = []
        covered = 0
        for spec, n in ordered:
            if covered >= TYPICAL_COVERAGE * total:
                break
            kept.append((spec, n))
            covered += n
        norm = sum(n for _, n in kept) or 1
        self.dist = tuple((s, n / norm) for s, n in kept)
        gpu_milli = sum(p * s.total_milli for s, p in self.dist)
        cpu = sum(p * s.cpu_milli for s, p in self.dist if s.gpus > 0)
        self.cpu_per_milli = cpu / gpu_milli if gpu_milli else 0.0
        self.version += 1
        self._compiled.clear()

    def frag(self, free: IntArr, cpu: IntArr, tid: IntArr, types: tuple[str, ...]) -> FloatArr:
        """Expected fragment (milli) of node states: ``free`` (..., G), ``cpu``/``tid`` (...)."""
        return self.compiled(types).frag(free, cpu, tid)

    def compiled(self, types: tuple[str, ...]) -> _Compiled:
        got = self._compiled.get(types)
        if got is None:
            got = self._compiled[types] = _Compiled(self.dist, types)
        return got


class _Compiled:
    """The typical pods as arrays: GPU specs grouped by (per-GPU milli, GPU count)."""

    def __init__(self, dist: tuple[tuple[PodSpec, float], ...], types: tuple[str, ...]) -> None:
        groups = sorted({(s.milli, s.gpus) for s, _ in dist if s.gpus > 0})
        gidx = {g: i for i, g in enumerate(groups)}
        gpu_specs = [(s, p) for s, p in dist if s.gpus > 0]
        self.milli = np.array([g[0] for g in groups], dtype=np.int64)  # (U,)
        self.count = np.array([g[1] for g in groups], dtype=np.int64)  # (U,)
        self.cpu = np.array([s.cpu_milli for s, _ in gpu_specs], dtype=np.int64)  # (M,)
        weight = np.zeros((len(gpu_specs), len(groups)))  # (M, U): p of spec m in its group
        for m, (s, p) in enumerate(gpu_specs):
            weight[m, gidx[(s.milli, s.gpus)]] = p
        self.weight = weight
        access = np.array(
            [[not s.gpu_types or t in s.gpu_types for s, _ in gpu_specs] for t in types],
            dtype=np.bool_,
        ).reshape(len(types), len(gpu_specs))
        self.access = access  # (types, M)

    def frag(self, free: IntArr, cpu: IntArr, tid: IntArr) -> FloatArr:
        """Expected fragment (milli) of each node state; ``free`` is (..., G), the rest (...)."""
        total: FloatArr = free.sum(-1).astype(np.float64)
        if self.milli.size == 0:
            return total
        ge = free[..., None, :] >= self.milli[:, None]  # (..., U, G)
        fits = ge.sum(-1) >= self.count  # (..., U)
        small = np.where(ge, 0, free[..., None, :]).sum(-1)  # (..., U) milli too small
        acc = self.access[tid] & (cpu[..., None] >= self.cpu)  # (..., M)
        w = acc.astype(np.float64) @ self.weight  # (..., U)
        per = np.where(fits, small, total[..., None])
        out: FloatArr = total * (1.0 - w.sum(-1)) + (w * per).sum(-1)
        return out


def pod_frag(free: tuple[int, ...], cpu_free: int, gpu_type: str, pod: PodSpec) -> int:
    """Idle GPU milli on a node that ``pod`` cannot use (FGD's per-pod fragment); the scalar
    reference for ``_Compiled.frag``."""
    total = sum(free)
    if pod.gpus == 0:
        return total
    if (pod.gpu_types and gpu_type not in pod.gpu_types) or cpu_free < pod.cpu_milli:
        return total
    if sum(1 for f in free if f >= pod.milli) >= pod.gpus:
        return sum(f for f in free if f < pod.milli)
    return total


def node_frag(
    free: tuple[int, ...], cpu_free: int, gpu_type: str, workload: TypicalWorkload
) -> float:
    return sum(p * pod_frag(free, cpu_free, gpu_type, s) for s, p in workload.dist)


def _quantize(score: FloatArr) -> FloatArr:
    """Kubernetes integer score: truncate a 0..1 score scaled to 0..100."""
    out: FloatArr = np.floor(score * K8S_MAX_SCORE)
    return out


def _first_best(scores: FloatArr, ok: BoolArr) -> tuple[FloatArr, IntArr]:
    """Per row: the best score over the allowed columns and the first column reaching it."""
    masked = np.where(ok, scores, -np.inf)
    col = masked.argmax(axis=1).astype(np.int64)
    return masked[np.arange(len(col)), col], col


class _TieBreak:
    """Ties between nodes: uniformly at random (``random_ties``, seeded), else the first node
    of a fixed seeded node order (consistent ties pack work onto the same nodes)."""

    random_ties = False

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._seed = seed
        self._rank: IntArr = np.zeros(0, dtype=np.int64)

    def pick(self, scores: FloatArr, nodes: IntArr) -> int:
        best = np.flatnonzero(scores == scores.max())
        if len(best) == 1:
            return int(best[0])
        if self.random_ties:
            return int(best[self._rng.randrange(len(best))])
        top = int(nodes.max()) + 1
        if len(self._rank) < top:
            size = max(top, 2 * len(self._rank))
            self._rank = np.random.default_rng(self._seed).permutation(size)
        return int(best[self._rank[nodes[best]].argmin()])


class BestFit(_TieBreak):
    """The FGD experiments' best-fit: the node whose CPU and GPU left over after placement
    (each normalised by the largest node of the pool, weighted 1/2 each) is smallest; inside the
    node, the tightest GPU that fits (lowest index first), whole GPUs lowest index first.
    ``levels`` quantises the score to integers 0..levels as Kubernetes does (None: exact)."""

    name = "best-fit"
    cacheable = True

    def __init__(self, seed: int = 0, levels: int | None = K8S_MAX_SCORE) -> None:
        super().__init__(seed)
        self.levels = levels

    def observe(self, job: Job) -> None:
        return None

    def version(self) -> int:
        return 0

    def score(self, c: Candidates) -> tuple[FloatArr, IntArr]:
        left_gpu = c.free.sum(1) - c.pod.total_milli
        left = 0.5 * (c.cpu - c.pod.cpu_milli) / c.cpu_cap + 0.5 * left_gpu / c.gpu_cap
        s: FloatArr = 1.0 - left
        if self.levels is not None:
            s = np.floor(s * self.levels)
        if c.pod.sharing:
            col = np.where(c.fit, c.free, np.iinfo(np.int64).max).argmin(axis=1)
        else:
            col = np.full(len(s), -1)
        return s, col.astype(np.int64)


class RandomFit:
    """Uniformly random node among the feasible ones, then a random GPU that fits (seeded)."""

    name = "random"
    cacheable = False

    def __init__(self, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)

    def observe(self, job: Job) -> None:
        return None

    def version(self) -> int:
        return 0

    def score(self, c: Candidates) -> tuple[FloatArr, IntArr]:
        r = len(c.cpu)
        s: FloatArr = self._rng.random(r)
        if not c.pod.sharing:
            return s, np.full(r, -1, dtype=np.int64)
        _, col = _first_best(self._rng.random(c.fit.shape), c.fit)
        return s, col

    def pick(self, scores: FloatArr, nodes: IntArr) -> int:
        return int(scores.argmax())


class FragmentationGradient(_TieBreak):
    """FGD: place where the expected fragmentation over the typical pods grows least.

    Score = sigmoid(decrease of the node's fragmentation / 1000), which the paper's scheduler
    reports as a Kubernetes integer score 0..100 (``quantized``); a sharing pod goes to the GPU
    with the best score on the chosen node (lowest index first), whole GPUs lowest index first.
    """

    name = "fgd"
    cacheable = True

    def __init__(
        self, workload: TypicalWorkload | None = None, seed: int = 0, quantized: bool = True
    ) -> None:
        super().__init__(seed)
        self.workload = workload or TypicalWorkload()
        self.quantized = quantized

    def observe(self, job: Job) -> None:
        self.workload.observe(PodSpec.of(job))

    def version(self) -> int:
        return self.workload.version

    def delta(self, c: Candidates) -> FloatArr:
        """Fragmentation growth (milli) per row, or per (row, column) for a sharing pod."""
        model = self.workload.compiled(c.types)
        before = model.frag(c.free, c.cpu, c.tid)
        cpu_after = c.cpu - c.pod.cpu_milli
        if c.pod.sharing:
            after = model.frag(c.after(), cpu_after[:, None], c.tid[:, None])
            out: FloatArr = after - before[:, None]
            return out
        res: FloatArr = model.frag(c.after(), cpu_after, c.tid) - before
        return res

    def score(self, c: Candidates) -> tuple[FloatArr, IntArr]:
        d = self.delta(c)
        s: FloatArr = 1.0 / (1.0 + np.exp(d / 1000.0))  # sigmoid(-growth / 1000)
        if self.quantized:
            s = _quantize(s)
        if c.pod.sharing:
            return _first_best(s, c.fit)
        return s, np.full(len(s), -1, dtype=np.int64)


class FencePack(FragmentationGradient):
    """gpufence's own policy: FGD's gradient plus the GPU capacity a placement strands for lack
    of CPU and (shares) the eventual waste of the hole it leaves, at FGD's integer resolution,
    then tie-breaks inside a bucket.

    *CPU stranding.* FGD counts CPU only through "does one more typical pod fit on this node",
    so it lets CPU-only pods and CPU-hungry shares eat the CPU that a node's other free GPUs
    will need; those GPUs then idle with no pod able to start beside them. Here a node's
    stranded capacity is the free GPU milli its free CPU cannot feed at the typical GPU pods'
    CPU per GPU milli (``TypicalWorkload.cpu_per_milli``): ``max(0, free milli - free CPU /
    cpu_per_milli)``; its growth is added to the fragmentation growth (both in milli, weight
    1), so CPU-only pods drift to CPU-rich nodes whose GPUs are taken and shares avoid
    starving a node. openb, 4 seeds: every workload from -0.09..+0.56 pp to +0.35..+0.88 pp
    of published FGD (default 95.41 -> 95.91); weights 0.3 and 3, a 20 % CPU margin and host
    memory as a second resource were no better.

    *Hole waste.* FGD judges a GPU's hole by which typical pods fit it *now*, so it happily
    drops a 320 share into a 530 hole (a 470 share would have closed it to 60) and leaves 210
    that nothing typical fills. fence-pack also charges a share the change of the hole's
    *eventual* waste -- the least milli the hole can be left with when filled by typical shares
    only (``hole_waste``, a small table recomputed when the typical pods change) -- at weight
    ``HOLE_WEIGHT``. openb, 8 seeds: +0.06..+0.20 pp on every workload (weight 4: gpushare
    better, cpu250 -0.1).

    *Ties.* A sharing pod takes the tightest GPU anywhere in the pool among equal buckets (FGD
    takes the first best GPU of the node it picked); other pods go to the first node of a
    fixed seeded order -- consistent ties are what pack work onto few nodes (exact, unbucketed
    FGD spreads and loses ~4 pp on openb). A CPU-only pod treats a fragmentation growth of at
    most ``CPU_POD_DEAD_ZONE`` milli as none, so nodes it barely affects tie with unaffected
    ones and the order packs them (cpu250 +0.9 pp before the stranding term).

    Tried and dropped (bench/README.md has the figures): one-step look-ahead over the typical
    pods, node orders by GPU count or CPU per GPU, 50 / 200 score levels, tightness allowed to
    override a bucket, whole GPUs to the fullest node. What stands between this and 100 % on
    openb ``default`` is mostly arithmetic: every GPU holding an 810-milli pod keeps a 190-milli
    hole only the rare <= 190-milli pods (1.3 %) fit -- ~185 of the ~250 idle GPUs at the end
    (``sim.workloads.openb_bound`` turns that into a ceiling for any policy: 97.2 %).
    """

    name = "fence-pack"
    TIE = 0.5  # tie-break weight: below one bucket, so it never overrides the gradient
    CPU_POD_DEAD_ZONE = 100.0  # milli of fragmentation growth a CPU-only pod may cause "free"
    HOLE_WEIGHT = 2.0  # weight of the hole's eventual-waste change (milli per milli)

    def __init__(self, workload: TypicalWorkload | None = None, seed: int = 0) -> None:
        super().__init__(workload, seed, quantized=True)
        self._holes: tuple[int, FloatArr] = (-1, np.zeros(0))

    def hole_waste(self) -> FloatArr:
        """Per hole size 0..1000 milli: the least it can be left with once typical shares fill
        it (each size as often as needed; a hole nothing typical fits keeps all of it)."""
        version, table = self._holes
        if version != self.workload.version:
            sizes = sorted({s.milli for s, _ in self.workload.dist if s.sharing})
            table = np.arange(MILLI_PER_GPU + 1, dtype=np.float64)
            for r in range(1, MILLI_PER_GPU + 1):
                for m in sizes:
                    if m > r:
                        break
                    table[r] = min(table[r], table[r - m])
            self._holes = (self.workload.version, table)
        return table

    def stranded(self, free_milli: IntArr, cpu: IntArr) -> FloatArr:
        """Of the free GPU milli of nodes (``free_milli``, ``cpu``: one entry per node), what
        their free CPU cannot feed at the typical pods' CPU per GPU milli."""
        per = self.workload.cpu_per_milli
        if per <= 0.0:
            return np.zeros(free_milli.shape)
        out: FloatArr = np.maximum(0.0, free_milli - cpu / per)
        return out

    def growth(self, c: Candidates) -> FloatArr:
        """Fragmentation, stranding and (sharing pods) hole-waste growth (milli) per row, or
        per (row, column)."""
        d = self.delta(c)
        if c.pod.gpus == 0:
            d = np.where(d <= self.CPU_POD_DEAD_ZONE, 0.0, d)
        # a node's free milli drops by the pod's total whichever GPU it takes: one figure a row
        total = c.free.sum(1)
        strand = self.stranded(total - c.pod.total_milli, c.cpu - c.pod.cpu_milli)
        strand -= self.stranded(total, c.cpu)
        if c.pod.sharing:
            waste = self.hole_waste()
            free = np.clip(c.free, 0, MILLI_PER_GPU)
            hole = waste[np.clip(free - c.pod.milli, 0, MILLI_PER_GPU)] - waste[free]
            out: FloatArr = d + strand[:, None] + self.HOLE_WEIGHT * hole
            return out
        res: FloatArr = d + strand
        return res

    def score(self, c: Candidates) -> tuple[FloatArr, IntArr]:
        q = _quantize(1.0 / (1.0 + np.exp(self.growth(c) / 1000.0)))
        if c.pod.sharing:
            tight = 1.0 - (c.free - c.pod.milli) / MILLI_PER_GPU  # (r, G); 1 = exact fit
            return _first_best(q + self.TIE * tight, c.fit)
        out: FloatArr = q  # other pods: the bucket, then the consistent node order
        return out, np.full(len(out), -1, dtype=np.int64)
