"""Fractional placement scorers: fragmentation model, best-fit, fgd, random, fence-pack."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Bind
from gpufence.model.events import JobSubmitted
from gpufence.model.job import GpuRequest
from gpufence.model.partition import SharingMode
from gpufence.sched.placement.fractional import pool_index
from gpufence.sched.placement.scoring import (
    BestFit,
    Candidates,
    FencePack,
    FragmentationGradient,
    PodSpec,
    RandomFit,
    TypicalWorkload,
    node_frag,
    pod_frag,
)
from gpufence.sched.registry import SCORERS, make_scorer
from gpufence.sched.scheduler import Scheduler, SchedulerConfig
from gpufence.testing.builders import ClusterBuilder, job

SPECS = Counter(
    {
        PodSpec(4000, 500, 1): 40,
        PodSpec(8000, 1000, 1): 30,
        PodSpec(2000, 250, 1, ("B",)): 15,
        PodSpec(16000, 1000, 2): 10,
        PodSpec(12000, 0, 0): 4,
        PodSpec(1000, 1000, 8): 1,
    }
)


def workload() -> TypicalWorkload:
    wl = TypicalWorkload()
    wl.set_counts(SPECS)
    return wl


def test_typical_pods_cover_95_percent_and_stay_fixed() -> None:
    wl = workload()
    assert [s for s, _ in wl.dist] == list(SPECS)[:4]  # 95 of 100 pods reach the 95% cut
    assert sum(p for _, p in wl.dist) == pytest.approx(1.0)
    v = wl.version
    wl.observe(PodSpec(1, 1, 1))
    assert wl.version == v


def test_vectorised_frag_matches_the_scalar_definition() -> None:
    wl = workload()
    types = ("A", "B")
    rng = random.Random(7)
    for _ in range(300):
        n = rng.choice([1, 2, 4, 8])
        free = tuple(rng.choice([0, 100, 250, 500, 600, 1000]) for _ in range(n))
        cpu, t = rng.choice([0, 2000, 5000, 20000]), rng.choice(types)
        padded = np.array([[*free, *([0] * (8 - n))]])
        got = wl.frag(padded, np.array([cpu]), np.array([types.index(t)]), types)[0]
        assert got == pytest.approx(node_frag(free, cpu, t, wl))


def test_pod_frag_definition() -> None:
    pod = PodSpec(4000, 500, 1)
    assert pod_frag((1000, 300), 8000, "A", pod) == 300  # fits: the 300 GPU is the fragment
    assert pod_frag((1000, 300), 1000, "A", pod) == 1300  # lacks CPU: all of it
    assert pod_frag((400, 300), 8000, "A", pod) == 700  # no GPU with room
    assert pod_frag((1000,), 8000, "A", PodSpec(4000, 500, 1, ("B",))) == 1000  # no access
    assert pod_frag((1000,), 8000, "A", PodSpec(100, 0, 0)) == 1000  # CPU-only: all


def cands(free: list[list[int]], cpu: list[int], pod: PodSpec) -> Candidates:
    f = np.array(free, dtype=np.int64)
    if pod.sharing:
        fit = f >= pod.milli
    else:
        full = f == 1000
        fit = full & (np.cumsum(full, axis=1) <= pod.gpus)
    n = len(free)
    return Candidates(
        free=f,
        cpu=np.array(cpu, dtype=np.int64),
        mem=np.full(n, 1 << 20, dtype=np.int64),
        tid=np.zeros(n, dtype=np.int64),
        types=("A",),
        pod=pod,
        fit=fit,
        cpu_cap=64000,
        mem_cap=1 << 20,
        gpu_cap=8000,
    )


def test_best_fit_tightest_node_and_gpu() -> None:
    c = cands([[1000, 1000], [1000, 600], [600, 1000]], [32000, 32000, 32000], PodSpec(0, 500, 1))
    score, col = BestFit().score(c)
    assert score[0] < score[1] == score[2]
    assert list(col[1:]) == [1, 0]  # the 600 GPU, wherever it is


def test_fgd_avoids_creating_fragments() -> None:
    # a 500 pod on the half-used GPU leaves nothing; on a fresh GPU it leaves a 500 hole,
    # which the 1000-milli typical pods cannot use
    c = cands([[1000, 500]], [32000], PodSpec(4000, 500, 1))
    fgd = FragmentationGradient(workload(), quantized=False)
    _, col = fgd.score(c)
    assert col[0] == 1
    d = fgd.delta(c)
    assert d[0, 1] < d[0, 0]


def test_typical_cpu_per_gpu_milli() -> None:
    # kept specs 40/30/15/10 pods: CPU 590,000 over 73,750 GPU milli
    assert workload().cpu_per_milli == pytest.approx(8.0)
    assert TypicalWorkload().cpu_per_milli == 0.0  # nothing observed: no stranding term


def test_fence_pack_keeps_cpu_for_free_gpus() -> None:
    # A CPU-only pod: node 0's GPUs are all taken, node 1 has 8 free GPUs and exactly the CPU
    # they need (8 CPU per GPU milli x 8,000). FGD sees no fragment on either node (every
    # typical pod still fits beside it); fence-pack sees 1,500 milli of node 1 stranded.
    pod = PodSpec(12000, 0, 0)
    c = cands([[0] * 8, [1000] * 8], [40000, 64000], pod)
    fgd_score, _ = FragmentationGradient(workload()).score(c)
    assert fgd_score[0] == fgd_score[1]
    fp = FencePack(workload())
    assert list(fp.growth(c)) == pytest.approx([0.0, 1500.0])
    score, _ = fp.score(c)
    assert score[0] > score[1]
    # a share that would starve a node's other GPUs of CPU goes where CPU is left over
    share = PodSpec(16000, 500, 1)
    c = cands([[1000, 1000], [1000, 1000]], [16000, 40000], share)
    fp = FencePack(workload())
    strand = fp.growth(c) - fp.delta(c)  # node 0 left with no CPU: 1,500 milli stranded
    assert np.allclose(strand, [[1500.0, 1500.0], [0.0, 0.0]])
    score, _ = FencePack(workload()).score(c)
    assert score[1] > score[0]


def test_fence_pack_charges_a_share_for_the_hole_it_leaves() -> None:
    wl = TypicalWorkload()
    wl.set_counts(
        Counter({PodSpec(1000, 470, 1): 40, PodSpec(1000, 320, 1): 30, PodSpec(1000, 650, 1): 30})
    )
    fp = FencePack(wl)
    waste = fp.hole_waste()
    # 530 closes to 60 with a 470; 210 fits nothing; 350 closes to 30 with a 320; a whole GPU
    # at best to 30 (650 + 320)
    assert [waste[r] for r in (530, 210, 350, 1000, 0)] == [60, 210, 30, 30, 0]
    # a 320 share: into the 530 hole it leaves 210 for good (+150 eventual waste, x2), into
    # the 350 hole it costs nothing
    c = cands([[530, 350]], [32000], PodSpec(1000, 320, 1))
    assert np.allclose(fp.growth(c) - fp.delta(c), [[300.0, 0.0]])
    _, col = fp.score(c)
    assert col[0] == 1


def test_stranding_matches_its_definition() -> None:
    fp = FencePack(workload())
    rng = np.random.default_rng(3)
    free = rng.choice([0, 250, 500, 1000], size=(50, 8))
    cpu = rng.integers(0, 80000, size=50)
    want = [max(0.0, f.sum() - c / 8.0) for f, c in zip(free, cpu, strict=True)]
    assert list(fp.stranded(free.sum(1), cpu)) == pytest.approx(want)


def test_random_is_seeded() -> None:
    c = cands([[1000, 1000]] * 5, [32000] * 5, PodSpec(0, 300, 1))
    a, b = RandomFit(1).score(c), RandomFit(1).score(c)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    other = RandomFit(2).score(c)  # a scorer that ignored its seed would draw the same
    assert not np.array_equal(a[0], other[0]) and not np.array_equal(a[1], other[1])


def test_registry_names() -> None:
    assert set(SCORERS) == {"best-fit", "random", "fgd", "fence-pack"}
    for name in SCORERS:
        assert make_scorer(name, 3).name == name
    with pytest.raises(ValueError, match="known"):
        make_scorer("nope", 0)


def cluster(policy: str) -> Cluster:
    return (
        ClusterBuilder()
        .nodes("a", 2, gpus=2, cpu_cores=8, mem_gib=64)
        .nodes("b", 1, gpus=4, cpu_cores=8, mem_gib=64)
        .partition("frac", groups=["a", "b"], sharing=SharingMode.FRACTIONAL, placement=policy)
        .build()
    )


@pytest.mark.parametrize("policy", sorted(SCORERS))
def test_fractional_pods_fill_gpus_through_the_scheduler(policy: str) -> None:
    sched = Scheduler(cluster(policy), SchedulerConfig(seed=5, validate=True))
    bound = 0
    for i in range(16):
        j = job(f"j{i}").fraction(500).build()
        d = sched.step([JobSubmitted(j)], float(i))
        bound += sum(isinstance(x, Bind) for x in d)
    assert bound == 16  # 8 GPUs x 2 halves: every policy must find every hole
    assert sched.ledger.pool_used["frac"] == 8000


def test_gang_of_shares_and_gpu_memory() -> None:
    sched = Scheduler(cluster("fgd"), SchedulerConfig(validate=True))
    gang = replace(job("g").fraction(600).build(), replicas=2)
    d = sched.step([JobSubmitted(gang)], 0.0)
    (bind,) = [x for x in d if isinstance(x, Bind)]
    gpus = [a.gpus[0] for a in bind.assignments]
    assert len(gpus) == 2 and gpus[0] != gpus[1]  # 2 x 600 milli cannot share one GPU
    sched2 = Scheduler(cluster("fgd"), SchedulerConfig(validate=True))
    m = job("m").fraction(300, 50 * 1024).build()
    n = job("n").fraction(300, 50 * 1024).build()
    d2 = sched2.step([JobSubmitted(m), JobSubmitted(n)], 0.0)
    gpus = [a.gpus[0] for x in d2 if isinstance(x, Bind) for a in x.assignments]
    assert len(gpus) == 2 and gpus[0] != gpus[1]  # 100 GiB of GPU memory: not on one 80 GiB GPU


def test_whole_and_cpu_only_requests_and_index_versions() -> None:
    sched = Scheduler(cluster("fence-pack"), SchedulerConfig(validate=True))
    idx = pool_index(sched.ledger, "frac")
    v0 = idx.version.copy()
    j4 = job("w").gpus(4).build()
    cpu = replace(job("c").cpu(2000).build(), request=GpuRequest.whole(0))
    d = sched.step([JobSubmitted(j4), JobSubmitted(cpu)], 0.0)
    binds = {x.job_id: x for x in d if isinstance(x, Bind)}
    assert len(binds["w"].assignments[0].gpus) == 4
    assert binds["c"].assignments[0].gpus == ()
    idx = pool_index(sched.ledger, "frac")
    assert (idx.version != v0).sum() >= 1
