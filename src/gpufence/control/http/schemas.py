"""Response models of every route: the OpenAPI document is the contract, so a generated client
gets types, not ``Dict[str, Any]``.

The routes build their JSON themselves (a list page of 1,000 jobs embeds the stored specs as
they are, ``jobs_routes.job_page_json``) and name these models in ``responses`` (``ok``):
FastAPI documents them without re-validating every answer.
``tests/integration/test_api_contract.py`` checks that each route's real answer round-trips
through its model unchanged (no field the model lacks), and that the document has no untyped
response anywhere. Optional fields marked "real GPUs" appear
only when the control plane runs on NVML; "tenant view" ones only in a tenant's answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias, Union

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypeAliasType

from gpufence.control.base.jobspec import SubmitRequest

if TYPE_CHECKING:  # mypy does not follow a recursive TypeAliasType; pydantic needs one
    JSONValue: TypeAlias = Any
else:
    JSONValue = TypeAliasType(
        "JSONValue",
        Union[str, int, float, bool, list["JSONValue"], dict[str, "JSONValue"], None],  # noqa: UP007
    )
"""Plain JSON data (advice evidence: counts, time ranges, job ids)."""


class _Out(BaseModel):
    model_config = ConfigDict(populate_by_name=True)


class PendingWhy(_Out):
    reason: str = Field(description="machine-readable, e.g. quota, gang-fragmented, dependency")
    message: str


class JobSummary(_Out):
    """A job as ``GET /v1/jobs`` lists it."""

    id: str
    seq: int = Field(description="submission order; the list's `after` cursor")
    tenant: str
    state: str = Field(description="pending, starting, running, stopping, done, failed, ...")
    reason: str
    message: str
    workload_class: str = Field(alias="class")
    partition: str
    queue: str
    attempt: int
    submitted_at: float = Field(description="seconds since the epoch")
    started_at: float | None = Field(description="the current attempt's start")
    ended_at: float | None
    exit_code: int | None
    gpus: str = Field(description="what it asks for in words, e.g. '2x 4 GPUs'")
    name: str | None
    held: bool = Field(description="on hold (gpufence hold): pending until released")
    spec: SubmitRequest = Field(description="the accepted submit request, as stored")
    pending: PendingWhy | None = Field(default=None, description="why it waits (pending only)")


class JobList(_Out):
    jobs: list[JobSummary]
    next_after: int = Field(description="pass as `after` for the next page")


class AssignmentOut(_Out):
    node: int
    gpus: list[int] = Field(description="global GPU ids")
    milli: int = 1000
    gpu_mem_mib: int = 0
    mig_profile: str | None = None
    mig_start: int | None = None
    time_sliced: bool = False


class AttemptOut(_Out):
    job_id: str
    attempt: int
    state: str
    pool: str = Field(description="the partition whose GPUs it ran on")
    lent_from: str | None
    assignments: list[AssignmentOut]
    devices: list[list[str]] = Field(description="per replica: CUDA_VISIBLE_DEVICES entries")
    started_at: float
    ended_at: float | None
    exit_codes: list[int | None] | None
    stop_reason: str | None
    requeue: bool


class JobDetail(JobSummary):
    """A job as ``GET /v1/jobs/{id}`` shows it: with its attempts."""

    attempts: list[AttemptOut]


class FairShareRow(_Out):
    queue: str
    tenant: str
    weight: float
    holding_gpus: float
    decayed_usage_gpu_h: float
    share: float
    rank: int
    explanation: str


class NoticeOut(_Out):
    reason: str
    deadline: float


class Explanation(_Out):
    id: str
    partition: str
    queue: str
    attempt: int
    state: str = Field(description="the job's state in the store")
    reason: str
    message: str
    fair_share: list[FairShareRow]
    scheduler_state: str | None = Field(default=None, description="the scheduler's, if it has it")
    pending: PendingWhy | None = None
    notice: NoticeOut | None = None


class MigSlot(_Out):
    profile: str
    start: int
    job: str | None
    other_tenant: bool | None = Field(default=None, description="tenant view")


class ForeignProcess(_Out):
    action: str
    since: float
    pid: int | None = Field(default=None, description="admin only")
    user: str | None = Field(default=None, description="admin only")
    command: str | None = Field(default=None, description="admin only")
    job: str | None = Field(default=None, description="admin only")


class GpuOut(_Out):
    index: int = Field(description="index on its node")
    id: int = Field(description="cluster-wide id")
    type: str
    partition: str
    nvlink_domain: int
    jobs: list[str]
    milli_used: int
    state: str = Field(
        description="free, used, held (idle, kept for a waiting gang), down or refused"
    )
    held_for: str | None = Field(
        default=None,
        description="held: the waiting gang's job id (null in a tenant's view of another's)",
    )
    mig: list[MigSlot] | None = None
    other_tenants_jobs: int | None = Field(default=None, description="tenant view")
    uuid: str | None = Field(default=None, description="the GPU's UUID (NVML or made up)")
    refused: str | None = Field(default=None, description="real GPUs")
    mig_status: str | None = Field(default=None, description="real GPUs")
    mig_error: str | None = Field(default=None, description="real GPUs")
    mig_failures: int | None = Field(default=None, description="real GPUs")
    mps: str | None = Field(default=None, description="real GPUs")
    mps_restarts: int | None = Field(default=None, description="real GPUs")
    foreign: list[ForeignProcess] | None = Field(default=None, description="real GPUs")
    utilization: float | None = Field(default=None, description="real GPUs: 0..1")


class NodeOut(_Out):
    name: str
    rack: str
    up: bool
    gpu_type: str
    fake: bool
    gpus: list[GpuOut]
    drain: NodeDrainOut | None = Field(
        default=None, description="drained (gpufence node drain), or in a maintenance window now"
    )
    other_tenants_gpus: int | None = Field(default=None, description="tenant view")


class NodeDrainOut(_Out):
    reason: str
    deadline: float | None = Field(description="running work stopped by then; null: it finishes")


class OthersSummary(_Out):
    gpus: int
    summary: str


class NodeList(_Out):
    nodes: list[NodeOut]
    other_tenants: OthersSummary | None = Field(default=None, description="tenant view")


class PartitionOut(_Out):
    name: str
    admits: list[str]
    sharing: str
    capacity_gpus: int
    used_gpus: float
    free_whole_gpus: int
    lent_gpus: int
    borrowed_gpus: int
    pending: int
    running: int
    largest_gang: int
    queues: list[str]
    enforced: bool | None = Field(default=None, description="real GPUs")
    enforcement: str | None = Field(default=None, description="real GPUs")


class PartitionList(_Out):
    partitions: list[PartitionOut]


class EventOut(_Out):
    seq: int
    t: float
    job_id: str | None
    kind: str
    reason: str
    message: str


class EventList(_Out):
    events: list[EventOut]
    next_after: int


class AdviceOut(_Out):
    rule: str
    severity: str
    path: str
    why: str
    evidence: dict[str, JSONValue] = Field(description="'summary' and the numbers behind it")
    fix: str
    diff: str
    scope: str
    line: int | None = None


class AdviceList(_Out):
    advice: list[AdviceOut]
    scope: str
    spec: str | None = Field(
        description="the cluster file the paths and lines refer to (the admin only: a path on "
        "the server)"
    )


class Health(_Out):
    ok: bool
    version: str
    store: str = Field(description="'ok' or why the store takes no writes")


# ---------------------------------------------------------------------------- accounting


class HistoryJob(_Out):
    """One job of ``gpufence history`` (sacct-like). GPU-equivalents: see ``usage``."""

    seq: int
    id: str
    name: str | None
    tenant: str
    partition: str
    workload_class: str = Field(alias="class")
    queue: str
    state: str
    reason: str
    exit_code: int | None
    submitted_at: float
    started_at: float | None = Field(description="its first bind (first attempt's start)")
    ended_at: float | None
    queue_delay_s: float | None = Field(description="submitted -> first bind")
    elapsed_s: float = Field(description="time its attempts held GPUs (bound -> stopped)")
    gpus: float | None = Field(description="GPU-equivalents its latest attempt held")
    request: str | None = Field(description="what it asks for in words")
    gpu_hours: float = Field(description="sum over attempts of held time x GPU-equivalents")
    attempts: int = Field(description="attempts started")
    preemptions: int = Field(description="attempts stopped for preemption or reclaim")


class HistoryPage(_Out):
    jobs: list[HistoryJob]
    next_after: int = Field(description="pass as `after` for the next page")


class UsageTotals(_Out):
    gpu_hours: float = Field(description="GPU-hours held inside the window")
    jobs: int = Field(description="jobs that held GPUs in the window")
    started: int = Field(description="jobs first bound in the window")
    queue_delay_p50_s: float | None = Field(description="of the jobs first bound in it")
    queue_delay_p95_s: float | None


class UsageGroup(UsageTotals):
    key: str = Field(description="the tenant, partition or class")


class UsageReport(_Out):
    by: str = Field(description="tenant, partition or class")
    since: float
    until: float
    groups: list[UsageGroup]
    total: UsageTotals


# ---------------------------------------------------------------------------- dashboard


class Whoami(_Out):
    """``GET /v1/dashboard/whoami``: the web dashboard's sign-in check."""

    tenant: str = Field(description="the token's tenant ('admin' for the admin token)")
    admin: bool
    version: str
    tenants: list[str] | None = Field(default=None, description="admin only: every tenant")
    partitions: list[str]
    queues: list[str]


class QueueJob(_Out):
    """A job as the dashboard's queue page lists it (no spec: the job page fetches it)."""

    id: str
    seq: int
    name: str | None
    tenant: str
    state: str
    workload_class: str = Field(alias="class")
    partition: str
    queue: str
    gpus: str = Field(description="what it asks for in words, e.g. '2x 4 GPUs'")
    attempt: int
    reason: str
    message: str
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    pending: PendingWhy | None = Field(default=None, description="why it waits (pending only)")


class QueuePage(_Out):
    total: int = Field(description="how many jobs match the filters")
    offset: int
    limit: int
    jobs: list[QueueJob]


class FairShareTables(_Out):
    partitions: dict[str, list[FairShareRow]] = Field(description="partition -> its table")


class MapJob(_Out):
    """What the GPU map labels a shown job with."""

    tenant: str
    name: str | None
    workload_class: str = Field(alias="class")
    partition: str
    state: str


class GpuSample(_Out):
    utilization: float | None = Field(description="latest sampled utilisation, 0..1")
    memory_used_bytes: float | None


class GpuMap(_Out):
    """``GET /v1/dashboard/gpus``: ``/v1/nodes`` plus the map's labels and colours."""

    nodes: list[NodeOut]
    jobs: dict[str, MapJob] = Field(description="job id -> its labels (a tenant: its own)")
    util: dict[str, GpuSample] = Field(description="'node/index' -> latest sample (real GPUs)")
    other_tenants_gpus: int | None = Field(default=None, description="tenant view")


def ok(model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """The documented 200 of a route that builds its JSON itself (named in its ``responses``)."""
    return {200: {"model": model, "description": "OK"}}
