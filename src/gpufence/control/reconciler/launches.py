"""One ``Launch`` per attempt, built the same way for a new bind and for recovery's adopt.

What the job gets from its tenant and its submit request: the Unix user (``run_as`` of its
tenant, else the default), the limits per member (``--cpus``, ``--mem``, the configured pids
limit), its command, cwd and environment. The environment here is the job's own ``--env`` plus
the server variables named by ``control.job_env_inherit``; the executor adds the allow-listed
part of its own environment and gpufence's variables (``base/memberenv.py``).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

from gpufence.control.base.config import ControlConfig
from gpufence.control.base.executor import Launch, Limits, Member
from gpufence.control.base.jobdirs import JOBS_DIR
from gpufence.control.base.jobspec import DEFAULT_PTY_GRACE_S, SubmitRequest
from gpufence.control.base.memberenv import inherited_env
from gpufence.control.base.sifcache import IMAGES_DIR
from gpufence.control.base.slurmenv import slurm_job_env
from gpufence.model.hardware import Node
from gpufence.model.partition import DEFAULT_LOG_LIMIT, Partition

MIB = 1 << 20
MIN_CPUS = 0.1


def job_dir(data_dir: Path, job_id: str) -> Path:
    return data_dir / JOBS_DIR / job_id


def launch_for(
    config: ControlConfig,
    data_dir: Path,
    job_id: str,
    attempt: int,
    tenant: str,
    spec: SubmitRequest,
    members: Sequence[Member],
    partition: Partition | None = None,
    nodes: Sequence[Node] = (),
) -> Launch:
    """The attempt's ``Launch``; ``partition`` (where it runs) gives its log cap (a submit's
    ``log_limit_bytes`` may lower it, never raise it: a tenant cannot lift its own cap);
    ``nodes`` (those its members run on) the CPU and memory limits of a submit that names none
    (``default_limits``)."""
    jdir = job_dir(data_dir, job_id)
    cpus, mem = default_limits(spec, nodes)
    env = inherited_env(os.environ, config.job_env_inherit) if config.job_env_inherit else {}
    # NVML (discovery) numbers GPUs in PCI bus order; make CUDA agree
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.update(spec.env)
    env.update(spec.array_env())  # GPUFENCE_ARRAY_TASK_ID / _JOB_ID of an array task
    # SLURM_JOB_ID and the others a batch script reads, twins of the GPUFENCE_* ones
    env.update(slurm_job_env(job_id, spec, partition.name if partition else spec.partition))
    return Launch(
        job_id=job_id,
        attempt=attempt,
        command=tuple(spec.command),
        env=env,
        members=tuple(members),
        attempt_dir=jdir / f"attempt-{attempt}",
        checkpoint_dir=jdir / "checkpoints",
        cwd=Path(spec.cwd) if spec.cwd else None,
        container=Path(spec.container) if spec.container else None,
        image_cache=data_dir / IMAGES_DIR if spec.container else None,
        run_as=config.run_as_for(tenant),
        limits=Limits(
            cpus=spec.cpus if spec.cpus is not None else cpus,
            mem_bytes=spec.mem_bytes if spec.mem_bytes is not None else mem,
            pids=config.job_pids_limit,
            log_bytes=log_limit(spec, partition),
            defaulted=frozenset(
                f
                for f, asked in (("cpus", spec.cpus), ("mem_bytes", spec.mem_bytes))
                if asked is None
            ),
        ),
        pty_grace_s=pty_grace(spec),
    )


def pty_grace(spec: SubmitRequest) -> float | None:
    """A pty job's grace (``Launch.pty_grace_s``: its command runs on a terminal served by a
    host the launcher forks, ``base/ptyhost.py``); None for any other job."""
    if not spec.pty:
        return None
    return spec.pty_grace_s if spec.pty_grace_s is not None else DEFAULT_PTY_GRACE_S


def default_limits(spec: SubmitRequest, nodes: Sequence[Node]) -> tuple[float | None, int | None]:
    """(CPU cores, memory bytes) of a member whose submit names none: its node's, in proportion
    to the GPUs it holds there (one GPU's worth for a share of one, or for a job with none),
    the smallest over the nodes of its gang. Without a limit one job's members could take
    every core and all the memory of a node whose other GPUs run other tenants' jobs.
    (None, None) without nodes (an adopted attempt: its cgroups exist already)."""
    sized = [n for n in nodes if n.gpu_ids]
    if not sized:
        return None, None
    held = max(float(spec.gpus), 1.0)
    cpus = min(n.cpu_milli / 1000 * held / len(n.gpu_ids) for n in sized)
    mem = min(n.mem_mib * MIB * held // len(n.gpu_ids) for n in sized)
    return max(round(cpus, 3), MIN_CPUS), max(int(mem), MIB)


def log_limit(spec: SubmitRequest, partition: Partition | None) -> int:
    """The smaller of the submit's cap and its partition's (``DEFAULT_LOG_LIMIT`` without one)."""
    most = partition.log_limit_bytes if partition is not None else DEFAULT_LOG_LIMIT
    return min(spec.log_limit_bytes, most) if spec.log_limit_bytes is not None else most


TRANSIENT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})


def transient_cause(exc: BaseException) -> str | None:
    """The transient OS error behind ``exc`` (its chain of causes), as its message; or None."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in TRANSIENT_ERRNOS:
            return seen.strerror or errno.errorcode.get(seen.errno or 0, "transient")
        seen = seen.__cause__ or seen.__context__
    return None


def launch_failure(exc: BaseException) -> tuple[str, str, tuple[int | None, ...]]:
    """(transient cause or "", the job's message, the exit codes to report) for a start that
    failed: a transient one (descriptors, processes, memory) is reported as lost -- an unknown
    exit code, requeued while ``max_attempts`` allows -- any other fails the attempt."""
    why = transient_cause(exc)
    if why:
        return why, f"launch failed ({why}; retried as the next attempt): {exc}", (None,)
    return "", f"launch failed: {exc}", ()
