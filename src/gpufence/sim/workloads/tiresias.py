"""Loader for the Tiresias (NSDI'19) simulator job trace, e.g. ``60_job.csv``.

Columns used: ``job_id``, ``num_gpu`` (gang size), ``submit_time`` (s), ``duration`` (s).
Ignored: ``iterations``, ``model_name``, ``interval``. Assumptions: every job is checkpointable
training (Tiresias preempts and resumes them); a gang larger than a node becomes replicas of a
whole node each (``num_gpu`` must then be a multiple of the node size); the duration is given to
the scheduler as the runtime estimate only when ``with_estimates`` is set.
Source: github.com/SymbioticLab/Tiresias ``simulator/`` (Apache-2.0).
"""

from __future__ import annotations

import csv
from pathlib import Path

from gpufence.model.job import GpuRequest, Job, WorkloadClass
from gpufence.sim.workloads.demand import open_trace
from gpufence.sim.workloads.records import WorkItem

REQUIRED = ("job_id", "num_gpu", "submit_time", "duration")


def load_tiresias(
    path: str | Path, gpus_per_node: int, with_estimates: bool = False, queue: str = ""
) -> list[WorkItem]:
    items: list[WorkItem] = []
    with open_trace(path) as f:  # plain or gzip
        reader = csv.DictReader(f)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing columns {', '.join(missing)} (need {REQUIRED})")
        for line, row in enumerate(reader, start=2):
            n = int(row["num_gpu"])
            dur = float(row["duration"])
            if n < 1 or dur <= 0:
                raise ValueError(f"{path}:{line}: num_gpu and duration must be positive")
            if n <= gpus_per_node:
                replicas, per = 1, n
            elif n % gpus_per_node == 0:
                replicas, per = n // gpus_per_node, gpus_per_node
            else:
                raise ValueError(
                    f"{path}:{line}: num_gpu {n} is not a multiple of {gpus_per_node} GPUs per node"
                )
            job = Job(
                id=f"tiresias-{row['job_id']}",
                workload_class=WorkloadClass.TRAINING,
                request=GpuRequest.whole(per),
                replicas=replicas,
                queue=queue,
                checkpointable=True,
                est_runtime_s=dur if with_estimates else None,
                submit_time=float(row["submit_time"]),
            )
            items.append(WorkItem(job, dur))
    return items
