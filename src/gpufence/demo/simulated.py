"""The demo's story (``story.py``) staged for the simulator: each act's cluster and workload.

``gpufence demo --simulated`` plays these acts on a virtual clock (the same scheduler core the
control plane calls), so a newcomer sees the fence at work in seconds, without processes. The
clusters are the shipped examples: act 1 on ``single-node-8gpu.yaml``; act 2 on ``mixed-64.yaml``,
where the serving fence also lends idle GPUs to checkpointable borrowers and batch evaluation
shares GPUs beside the gang.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpufence.demo.story import SEED_CASE, SERVING_SURGE, Act
from gpufence.model.cluster import Cluster
from gpufence.model.job import GpuRequest, Job, WorkloadClass
from gpufence.sim.workloads.records import WorkItem
from gpufence.spec import load_cluster

SEED_JOB_S = 150.0  # the seed's jobs ran ~2.5 min each on one GPU


def example_path(name: str) -> Path:
    return Path(str(resources.files("gpufence") / "examples" / name))


@dataclass(frozen=True)
class SimulatedAct:
    act: Act
    cluster: Cluster
    work: list[WorkItem]


def sixty_six_jobs() -> SimulatedAct:
    """8 GPUs, 66 one-GPU training jobs: the excess queues, every job completes, no GPU shared."""
    cluster = load_cluster(example_path("single-node-8gpu.yaml"))
    work = [
        WorkItem(Job(f"train-{i:02d}", WorkloadClass.TRAINING, GpuRequest.whole(1)), SEED_JOB_S)
        for i in range(66)
    ]
    return SimulatedAct(SEED_CASE, cluster, work)


def fenced_surge() -> SimulatedAct:
    """mixed-64: serving replicas in their fence, a checkpointing gang, borrowers of idle serving
    GPUs, a notebook that goes idle, batch eval shares, then a serving surge at t=2000 s."""
    cluster = load_cluster(example_path("mixed-64.yaml"))
    w: list[WorkItem] = []

    def serving(name: str, at: float, dur: float) -> WorkItem:
        job = Job(name, WorkloadClass.SERVING, GpuRequest.whole(1), queue="online", submit_time=at)
        return WorkItem(job, dur, ack_after_s=None)

    w += [serving(f"serve-{i:02d}", 0.0, 7000.0) for i in range(12)]
    gang = Job(
        "gang-2x8",
        WorkloadClass.TRAINING,
        GpuRequest.whole(8),
        replicas=2,
        queue="research",
        checkpointable=True,
        est_runtime_s=4000.0,
    )
    w.append(WorkItem(gang, 4000.0, ack_after_s=20.0, checkpoint_every_s=600.0))
    for i in range(16):
        q = "research" if i % 2 else "product"
        job = Job(
            f"train-{i:02d}",
            WorkloadClass.TRAINING,
            GpuRequest.whole(1),
            queue=q,
            est_runtime_s=3000.0,
            submit_time=10.0,
        )
        w.append(WorkItem(job, 3000.0))
    for i in range(4):  # checkpointable work that may borrow the serving fence's idle GPUs
        job = Job(
            f"borrow-{i}",
            WorkloadClass.TRAINING,
            GpuRequest.whole(1),
            queue="product",
            checkpointable=True,
            est_runtime_s=5000.0,
            submit_time=20.0,
        )
        w.append(WorkItem(job, 5000.0, ack_after_s=15.0, checkpoint_every_s=300.0))
    busy = (*tuple((60.0 * k, 0.6) for k in range(10)), (600.0, 0.0))
    nb = Job("notebook", WorkloadClass.INTERACTIVE, GpuRequest.mig("1g.10gb"), queue="notebooks")
    w.append(WorkItem(nb, 9000.0, ack_after_s=None, activity=busy))
    for i in range(12):
        milli = (250, 500, 330)[i % 3]
        job = Job(
            f"eval-{i:02d}",
            WorkloadClass.BATCH,
            GpuRequest.fraction(milli, 8192),
            queue="eval",
            cpu_milli=4000,
            mem_mib=16384,
            submit_time=30.0,
        )
        w.append(WorkItem(job, 900.0))
    w += [serving(f"surge-{i:02d}", 2000.0, 1500.0) for i in range(10)]
    return SimulatedAct(SERVING_SURGE, cluster, w)
