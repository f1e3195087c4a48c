"""``queue_order: las`` -- least attained service first (Tiresias, Gu et al., NSDI'19), for
training partitions where run times are unknown.

A job's attained service is the GPU-seconds it held in its earlier attempts (a job back from a
preemption, a reclaim or a node failure has some; a new job none). As in Tiresias' discretised
LAS, service is cut into levels -- under 1 GPU-hour, then x4 per level (4, 16, 64 GPU-hours, ...)
-- and jobs of a lower level go first, in submit order within a level, so that a job that has
already had a lot of the cluster waits behind the ones that have had little, and small
differences in service do not reshuffle the queue. Priority still comes first. The order is
not preemptive: running jobs are not stopped to enforce it.
"""

from __future__ import annotations

import math

from gpufence.sched.jobs import JobRecord

FIRST_LEVEL_GPU_S = 3600.0  # service below one GPU-hour: level 0
LEVEL_FACTOR = 4.0
LEVELS = 16  # levels per priority (the last one is open-ended)


def service_level(gpu_s: float) -> int:
    if gpu_s < FIRST_LEVEL_GPU_S:
        return 0
    return min(LEVELS - 1, 1 + int(math.log(gpu_s / FIRST_LEVEL_GPU_S, LEVEL_FACTOR)))


class LeastAttainedService:
    def rank(self, rec: JobRecord) -> int:
        return -rec.job.priority * LEVELS + service_level(rec.service_gpu_s)
