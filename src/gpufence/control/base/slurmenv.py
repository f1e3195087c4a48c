"""The ``SLURM_*`` variables a batch script commonly reads, alongside gpufence's own.

A script written for Slurm reads ``$SLURM_ARRAY_TASK_ID`` to pick its shard, ``$SLURM_JOB_ID``
to name its files, ``$SLURM_CPUS_PER_TASK`` to size its loader: without them it runs with
empty strings, wrongly and silently. Every job gets them (not only ``#SBATCH`` scripts: a
script may be submitted with ``--array`` on the command line), each with the value of its
``GPUFENCE_*`` twin. Ids are gpufence's (``j12``; an array's ``j4``), so a file named
``%A_%a.out`` is ``j4_3.out``, as ``gpufence status`` shows the task.

Job-wide ones come from ``slurm_job_env`` (the reconciler's ``launch_for``), per-member ones
(rank, GPUs) from ``slurm_member_env`` (``memberenv.member_envs``).
"""

from __future__ import annotations

import os

from gpufence.control.base.arrays import ArraySpecError, parse_array
from gpufence.control.base.jobspec import SubmitRequest

JOB_NAME = "SLURM_JOB_NAME"


def slurm_job_env(job_id: str, spec: SubmitRequest, partition: str) -> dict[str, str]:
    """The job-wide variables of ``spec`` running as ``job_id`` in ``partition``. The job's
    name is its ``--name``, else the one its submit put in its env (a script's file name, as
    sbatch names a job), else its program's base name."""
    name = spec.name or spec.env.get(JOB_NAME) or os.path.basename(spec.command[0])
    out = {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOBID": job_id,
        JOB_NAME: name,
        "SLURM_NTASKS": str(spec.replicas),
        "SLURM_NPROCS": str(spec.replicas),
        "SLURM_JOB_PARTITION": partition,
    }
    if spec.cwd:
        out["SLURM_SUBMIT_DIR"] = spec.cwd
    if spec.cpus is not None and spec.cpus == int(spec.cpus):  # Slurm's is a whole number
        out["SLURM_CPUS_PER_TASK"] = str(int(spec.cpus))
    t = spec.array_task
    if t is not None:
        out["SLURM_ARRAY_JOB_ID"] = t.job
        out["SLURM_ARRAY_TASK_ID"] = str(t.index)
        try:
            indices = parse_array(spec.array)[0] if spec.array else ()
        except ArraySpecError:  # a stored spec is valid; an older one may not say its range
            indices = ()
        if indices:
            out["SLURM_ARRAY_TASK_MIN"] = str(indices[0])
            out["SLURM_ARRAY_TASK_MAX"] = str(indices[-1])
            out["SLURM_ARRAY_TASK_COUNT"] = str(len(indices))
    return out


def slurm_member_env(rank: int, local: int, nodes: int, devices: tuple[str, ...]) -> dict[str, str]:
    """One gang member's: its rank (``SLURM_PROCID``), its rank on its node, the job's node
    count, and its GPUs' indices (``SLURM_JOB_GPUS``: only where they are indices, not MIG
    UUIDs; ``CUDA_VISIBLE_DEVICES`` names them either way)."""
    out = {
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(local),
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NUM_NODES": str(nodes),
    }
    if devices and all(d.isdigit() for d in devices):
        out["SLURM_JOB_GPUS"] = ",".join(devices)
    return out
