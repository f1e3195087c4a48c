"""What a user submits to the control plane, validated, and its translation to a core ``Job``.

Validation that needs no cluster (types, ranges, contradictory fields) happens here and becomes a
422 with field-level messages. Whether the cluster can ever hold the job is the scheduler's
intake check, which rejects at submit with the reason.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpufence.model.job import GpuRequest, Job, WorkloadClass

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables the executor sets; a user value would break GPU isolation or the handshake.
RESERVED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
)
MIB = 1 << 20
MAX_CPUS = 4096.0
MAX_MEM_BYTES = 1 << 50  # 1 PiB
MAX_TIME_LIMIT_S = 366 * 86400.0


class SubmitRequest(BaseModel):
    command: list[str] = Field(min_length=1, description="argv of each replica (no shell)")
    name: str | None = Field(default=None, max_length=128)
    workload_class: WorkloadClass = Field(default=WorkloadClass.TRAINING, alias="class")
    gpus: int = Field(default=1, ge=0, le=1024, description="whole GPUs per replica")
    mig: str | None = Field(default=None, description="one MIG instance of this profile")
    gpu_fraction: float | None = Field(default=None, gt=0.0, lt=1.0)
    gpu_mem_gib: float | None = Field(default=None, gt=0.0)
    replicas: int = Field(default=1, ge=1, le=4096)
    partition: str = ""
    queue: str = ""
    priority: int = Field(default=0, ge=-1000, le=1000)
    checkpointable: bool = False
    est_runtime_s: float | None = Field(default=None, gt=0.0)
    cpus: float | None = Field(
        default=None,
        ge=0.001,
        le=MAX_CPUS,
        description="CPU cores per replica (fractions allowed): placed on a node that has them "
        "free, and the member is limited to them",
    )
    mem_bytes: int | None = Field(
        default=None,
        ge=MIB,
        le=MAX_MEM_BYTES,
        description="host memory per replica in bytes: placed on a node that has it free; a "
        "member over it is OOM-killed (job failed, reason 'oom')",
    )
    time_limit_s: float | None = Field(
        default=None,
        gt=0.0,
        le=MAX_TIME_LIMIT_S,
        description="wall-clock limit of one attempt in seconds: stopped at it (notice first "
        "if checkpointable), reason 'time-limit'",
    )
    slo_p99_ms: float | None = Field(
        default=None,
        gt=0.0,
        le=3_600_000.0,
        allow_inf_nan=False,
        description="the latency SLO a serving job serves (advice tells serving from batch by it)",
    )
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    max_attempts: int = Field(
        default=3, ge=1, le=100, description="attempts when a run is lost (node failure, crash)"
    )
    tenant: str | None = Field(default=None, description="admin only: submit on behalf of")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for k in env:
            if not _ENV_NAME.match(k):
                raise ValueError(f"'{k}' is not a valid environment variable name")
            if k in RESERVED_ENV or k.startswith("GPUFENCE_"):
                raise ValueError(f"'{k}' is set by gpufence for every job; remove it")
        return env

    @model_validator(mode="after")
    def _one_request_kind(self) -> SubmitRequest:
        if self.mig is not None and self.gpu_fraction is not None:
            raise ValueError("give either mig or gpu_fraction, not both")
        if (self.mig is not None or self.gpu_fraction is not None) and self.gpus not in (0, 1):
            raise ValueError("mig and gpu_fraction take one GPU share per replica; drop gpus")
        if self.gpu_mem_gib is not None and self.gpu_fraction is None:
            raise ValueError("gpu_mem_gib goes with gpu_fraction (a share of one GPU)")
        if self.gpu_fraction is not None and round(self.gpu_fraction * 1000) < 1:
            raise ValueError("gpu_fraction must be at least 0.001")
        if (
            self.time_limit_s is not None
            and self.est_runtime_s is not None
            and self.est_runtime_s > self.time_limit_s
        ):
            raise ValueError(
                f"est_runtime_s ({self.est_runtime_s:g}) is longer than time_limit_s "
                f"({self.time_limit_s:g}): the job would be stopped before its expected end; "
                "raise time_limit_s or lower est_runtime_s"
            )
        return self

    @property
    def cpu_milli(self) -> int:
        """Per replica, as the core counts CPU (0: not requested)."""
        return round(self.cpus * 1000) if self.cpus is not None else 0

    @property
    def mem_mib(self) -> int:
        """Per replica, as the core counts host memory (0: not requested; rounded up)."""
        return -(-self.mem_bytes // MIB) if self.mem_bytes is not None else 0

    def request(self) -> GpuRequest:
        if self.mig is not None:
            return GpuRequest.mig(self.mig)
        if self.gpu_fraction is not None:
            mem = round((self.gpu_mem_gib or 0.0) * 1024)
            return GpuRequest.fraction(round(self.gpu_fraction * 1000), mem)
        return GpuRequest.whole(self.gpus)

    def to_job(self, job_id: str, submitted_at: float) -> Job:
        return Job(
            id=job_id,
            workload_class=self.workload_class,
            request=self.request(),
            replicas=self.replicas,
            queue=self.queue,
            partition=self.partition,
            priority=self.priority,
            checkpointable=self.checkpointable,
            est_runtime_s=self.est_runtime_s,
            submit_time=submitted_at,
            cpu_milli=self.cpu_milli,
            mem_mib=self.mem_mib,
            time_limit_s=self.time_limit_s,
        )

    def stored(self) -> dict[str, Any]:
        """The JSON kept in the store (and shown back to the user)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def from_stored(spec: dict[str, Any]) -> SubmitRequest:
    return SubmitRequest.model_validate(spec)
