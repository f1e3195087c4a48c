"""Jobs and GPU requests: what a user asks the scheduler for."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

MILLI_PER_GPU = 1000


class WorkloadClass(StrEnum):
    SERVING = "serving"
    TRAINING = "training"
    INTERACTIVE = "interactive"
    BATCH = "batch"


class AfterKind(StrEnum):
    """What a dependency waits for (``Job.after``), as Slurm's afterok / afterany / afternotok."""

    OK = "after-ok"  # the parent ended done
    ANY = "after-any"  # the parent ended, however
    NOT_OK = "after-not-ok"  # the parent ended without success (failed, cancelled, ...)


class RequestKind(StrEnum):
    WHOLE = "whole"  # whole GPUs (or one time-slice share per GPU in a time-slice partition)
    MIG = "mig"  # one MIG instance of a named profile
    FRACTION = "fraction"  # a milli-GPU share of one GPU plus GPU memory (openb-style)


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What one replica of a job needs from the GPUs of a single node."""

    kind: RequestKind = RequestKind.WHOLE
    gpus: int = 1  # whole GPUs per replica (WHOLE); always 1 for MIG / FRACTION
    mig_profile: str | None = None
    milli: int = MILLI_PER_GPU  # share of one GPU (FRACTION), 1..999
    gpu_mem_mib: int = 0  # GPU memory the share needs (FRACTION)

    @staticmethod
    def whole(gpus: int = 1) -> GpuRequest:
        return GpuRequest(RequestKind.WHOLE, gpus=gpus)

    @staticmethod
    def mig(profile: str) -> GpuRequest:
        return GpuRequest(RequestKind.MIG, gpus=1, mig_profile=profile)

    @staticmethod
    def fraction(milli: int, gpu_mem_mib: int = 0) -> GpuRequest:
        return GpuRequest(RequestKind.FRACTION, gpus=1, milli=milli, gpu_mem_mib=gpu_mem_mib)

    def describe(self) -> str:
        if self.kind is RequestKind.MIG:
            return f"mig {self.mig_profile}"
        if self.kind is RequestKind.FRACTION:
            mem = f" +{self.gpu_mem_mib}MiB" if self.gpu_mem_mib else ""
            return f"{self.milli}m GPU{mem}"
        return f"{self.gpus} GPU" + ("s" if self.gpus != 1 else "")


@dataclass(frozen=True, slots=True)
class Job:
    """A unit of work: a gang of ``replicas`` identical replicas, placed all-or-nothing.

    ``partition`` and ``queue`` may be left empty: the scheduler resolves the queue's partition, or
    the first partition admitting the job's class, and the partition's default queue for the
    job's tenant (``default_queue`` in sched/intake.py).
    """

    id: str
    workload_class: WorkloadClass = WorkloadClass.TRAINING
    request: GpuRequest = field(default_factory=GpuRequest)
    replicas: int = 1
    queue: str = ""
    partition: str = ""
    priority: int = 0
    checkpointable: bool = False
    est_runtime_s: float | None = None  # user's estimate; needed to backfill into reserved capacity
    submit_time: float = 0.0
    cpu_milli: int = 0  # per replica, checked against the node
    mem_mib: int = 0  # per replica host memory
    gpu_types: tuple[str, ...] = ()  # allowed GPU models (openb gpu_spec); empty = any
    # hard wall-clock limit of one attempt (the job is stopped at it, reason ``time-limit``);
    # unlike ``est_runtime_s`` it is enforced, so backfill and reservations may trust it
    time_limit_s: float | None = None
    # gates (sched/gates.py): a job with any of these set may wait outside the queues
    after: tuple[tuple[AfterKind, str], ...] = ()  # (kind, parent job id)
    held: bool = False  # submitted on hold: waits until released
    held_by: str = ""  # who held it (named in its pending reason: "held by alice")
    array_group: str = ""  # the array this job is a task of ("" : none)
    array_cap: int = 0  # at most this many tasks of ``array_group`` queued or running (0: no cap)
    # the tenant that submitted it ("" : the admin, or a simulation): a job naming no queue goes
    # to a queue of its tenant's, else to one nobody owns -- never into another tenant's quota
    tenant: str = ""

    @property
    def planned_runtime_s(self) -> float | None:
        """What backfill and reservations plan with: the time limit when there is one (it is
        enforced), else the user's estimate (None: unknown)."""
        return self.time_limit_s if self.time_limit_s is not None else self.est_runtime_s

    @property
    def total_gpus(self) -> int:
        """Whole GPUs (or GPU slots) the gang occupies at once."""
        return self.replicas * self.request.gpus

    def shape(self) -> tuple[object, ...]:
        """Jobs with equal shapes fit (or fail to fit) in exactly the same places."""
        return (
            self.workload_class,
            self.request,
            self.replicas,
            self.cpu_milli,
            self.mem_mib,
            self.gpu_types,
            self.checkpointable,
        )
