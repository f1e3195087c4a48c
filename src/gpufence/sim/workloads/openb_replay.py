"""Replay the openb pod list (Alibaba GPU v2023) over time on any cluster, for ``gpufence sim``.

Unlike the FGD protocol (bench/openb.py: arrivals only), this uses the trace's own times:
a pod arrives at ``creation_time`` and runs for ``deletion_time - creation_time`` (to the end of
the trace when it was never deleted). Mapping onto the cluster's partitions (assumptions):
  * GPU-sharing pods (num_gpu = 1, gpu_milli < 1000) and CPU-only pods are batch work in the
    first fractional partition admitting batch; without one, a sharing pod takes a whole GPU
    and CPU-only pods are left out (counted in ``skipped``);
  * whole-GPU pods (1..8 GPUs on one node) are training work;
  * qos LS (latency-sensitive) pods get priority 1, the rest 0; gpu_spec is kept as the
    GPU-type constraint only when the cluster has such GPU types.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufence.model.cluster import Cluster
from gpufence.model.job import GpuRequest, Job, WorkloadClass
from gpufence.model.partition import SharingMode
from gpufence.sim.workloads.openb import load_pods
from gpufence.sim.workloads.records import WorkItem


@dataclass(frozen=True)
class OpenbReplay:
    work: list[WorkItem]
    horizon_s: float
    skipped: int


def openb_replay(path: str | Path, cluster: Cluster) -> OpenbReplay:
    pods = load_pods(path)
    timed = [p for p in pods if p.creation_time is not None]
    if not timed:
        raise ValueError(f"{path}: no creation_time column: this openb file cannot be replayed")
    start = min(p.creation_time for p in timed if p.creation_time is not None)
    end = max(
        max((p.deletion_time or 0.0) for p in timed),
        max(p.creation_time or 0.0 for p in timed),
    )
    horizon = end - start + 1.0
    frac = next(
        (
            n
            for n, part in cluster.partitions.items()
            if part.sharing is SharingMode.FRACTIONAL and WorkloadClass.BATCH in part.admits
        ),
        None,
    )
    types = {g.gpu_type for g in cluster.gpus}
    work: list[WorkItem] = []
    skipped = 0
    for i, pod in enumerate(timed):
        assert pod.creation_time is not None
        at = pod.creation_time - start
        dur = max(1.0, (pod.deletion_time or end) - pod.creation_time)
        gpu_types = pod.gpu_spec if set(pod.gpu_spec) & types else ()
        prio = 1 if pod.qos == "LS" else 0
        if pod.num_gpu == 0 or pod.sharing:
            if frac is None and pod.num_gpu == 0:
                skipped += 1
                continue
            if frac is not None:
                req = GpuRequest.fraction(pod.gpu_milli) if pod.sharing else GpuRequest.whole(0)
                job = Job(
                    f"openb-{i:05d}",
                    WorkloadClass.BATCH,
                    req,
                    partition=frac,
                    priority=prio,
                    submit_time=at,
                    cpu_milli=pod.cpu_milli,
                    mem_mib=pod.mem_mib,
                    gpu_types=gpu_types,
                    est_runtime_s=None,
                )
            else:
                job = Job(
                    f"openb-{i:05d}",
                    WorkloadClass.BATCH,
                    GpuRequest.whole(1),
                    priority=prio,
                    submit_time=at,
                    gpu_types=gpu_types,
                )
        else:
            job = Job(
                f"openb-{i:05d}",
                WorkloadClass.TRAINING,
                GpuRequest.whole(pod.num_gpu),
                priority=prio,
                submit_time=at,
                gpu_types=gpu_types,
            )
        work.append(WorkItem(job, dur, ack_after_s=None))
    return OpenbReplay(work, horizon, skipped)
