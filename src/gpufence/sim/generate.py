"""Generate the batch side of a scenario: training gangs, notebooks, batch eval, node failures.

Everything draws from one numpy Generator seeded by the scenario, so a seed fixes the workload.
Arrivals are Poisson; run times are lognormal (default fitted to Philly); notebooks alternate
active and idle phases (exponential lengths) and report activity at every phase change.
"""

from __future__ import annotations

import math

import numpy as np

from gpufence.model.cluster import Cluster
from gpufence.model.events import NodeDown, NodeUp
from gpufence.model.job import GpuRequest, Job, WorkloadClass
from gpufence.sim.scenario import Duration, Scenario
from gpufence.sim.workloads.records import At, CommSpec, WorkItem


def _durations(rng: np.random.Generator, spec: Duration, n: int) -> np.ndarray:
    raw = rng.lognormal(math.log(spec.median_s), spec.sigma, n) * spec.scale
    return np.clip(raw, spec.min_s, spec.max_s)


def _arrivals(rng: np.random.Generator, per_hour: float, horizon: float) -> np.ndarray:
    if per_hour <= 0:
        return np.zeros(0)
    n = rng.poisson(per_hour * horizon / 3600.0)
    return np.sort(rng.uniform(0.0, horizon, n))


def generate(sc: Scenario, cluster: Cluster) -> tuple[list[WorkItem], list[At]]:
    rng = np.random.default_rng(sc.seed)
    items: list[WorkItem] = []
    items += _training(sc, rng)
    items += _notebooks(sc, rng)
    items += _batch(sc, rng)
    events = _failures(sc, cluster, rng)
    items.sort(key=lambda w: (w.job.submit_time, w.job.id))
    return items, events


def _training(sc: Scenario, rng: np.random.Generator) -> list[WorkItem]:
    t = sc.training
    if t is None:
        return []
    times = _arrivals(rng, t.arrivals_per_hour, sc.horizon_s)
    sizes = np.array(sorted(t.gang_sizes), dtype=int)
    weights = np.array([t.gang_sizes[s] for s in sizes], dtype=float)
    picked = rng.choice(sizes, size=len(times), p=weights / weights.sum())
    durs = _durations(rng, t.duration, len(times))
    ckpt = rng.random(len(times)) < t.checkpointable
    est = rng.random(len(times)) < t.with_estimates
    queues = t.queues or [""]
    comm = CommSpec(t.allreduce_gb, t.compute_s) if t.allreduce_gb > 0 else None
    out: list[WorkItem] = []
    for i, (at, size, dur) in enumerate(zip(times, picked, durs, strict=True)):
        size = int(size)
        replicas, per = (1, size) if size <= 8 else (size // 8, 8)
        job = Job(
            id=f"train-{i:05d}",
            workload_class=WorkloadClass.TRAINING,
            request=GpuRequest.whole(per),
            replicas=replicas,
            queue=queues[i % len(queues)],
            partition="" if t.queues else t.partition,
            checkpointable=bool(ckpt[i]),
            est_runtime_s=float(dur) if est[i] else None,
            submit_time=float(at),
        )
        every = t.checkpoint_every_s if ckpt[i] else None
        out.append(
            WorkItem(
                job,
                float(dur),
                ack_after_s=30.0 if ckpt[i] else None,
                checkpoint_every_s=every,
                comm=comm if size >= 2 else None,
            )
        )
    return out


def _notebooks(sc: Scenario, rng: np.random.Generator) -> list[WorkItem]:
    nb = sc.notebooks
    if nb is None:
        return []
    out: list[WorkItem] = []
    for i, at in enumerate(_arrivals(rng, nb.sessions_per_hour, sc.horizon_s)):
        length = float(rng.exponential(nb.session_s)) + 300.0
        activity: list[tuple[float, float]] = []
        clock, active = 0.0, True
        while clock < length:
            activity.append((clock, float(rng.uniform(0.3, 0.9)) if active else 0.0))
            clock += float(rng.exponential(nb.active_s if active else nb.idle_s))
            active = not active
        req = GpuRequest.mig(nb.mig_profile) if nb.mig_profile else GpuRequest.whole(1)
        job = Job(
            f"notebook-{i:05d}",
            WorkloadClass.INTERACTIVE,
            req,
            partition=nb.partition,
            submit_time=float(at),
        )
        out.append(WorkItem(job, length, ack_after_s=None, activity=tuple(activity)))
    return out


def _batch(sc: Scenario, rng: np.random.Generator) -> list[WorkItem]:
    b = sc.batch
    if b is None:
        return []
    times = _arrivals(rng, b.jobs_per_hour, sc.horizon_s)
    durs = _durations(rng, b.duration, len(times))
    out: list[WorkItem] = []
    for i, (at, dur) in enumerate(zip(times, durs, strict=True)):
        if b.gpu_fraction is not None:
            req = GpuRequest.fraction(round(b.gpu_fraction * 1000), int(b.gpu_mem_gib * 1024))
        else:
            req = GpuRequest.whole(b.gpus)
        job = Job(
            f"eval-{i:05d}",
            WorkloadClass.BATCH,
            req,
            partition=b.partition,
            est_runtime_s=float(dur),
            submit_time=float(at),
        )
        out.append(WorkItem(job, float(dur), ack_after_s=None))
    return out


def _failures(sc: Scenario, cluster: Cluster, rng: np.random.Generator) -> list[At]:
    f = sc.failures
    if f is None:
        return []
    out: list[At] = []
    rate = len(cluster.nodes) / (f.node_mtbf_h * 3600.0)
    n = rng.poisson(rate * sc.horizon_s)
    for at in np.sort(rng.uniform(0.0, sc.horizon_s, n)):
        node = cluster.nodes[int(rng.integers(len(cluster.nodes)))].name
        out.append(At(float(at), NodeDown(node)))
        out.append(At(float(at) + f.repair_s, NodeUp(node)))
    return out
