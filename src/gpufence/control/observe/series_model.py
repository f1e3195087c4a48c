"""The answer of ``GET /v1/series``: the joint view's data on one time axis (typed for OpenAPI).

Every list in a series is aligned with ``t`` (``t[i]`` is the start of bucket ``i``, which holds
the points sampled in ``[t[i], t[i] + step_s)``); ``null`` means nothing was sampled for it in
that bucket (before the plane started, before the series reached back that far, or a measure
this machine cannot read).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

LinkClass = Literal["nvlink", "pcie", "nic"]
MarkKind = Literal[
    "preemption", "reclaim", "notice", "notice-withdrawn", "stop", "requeue", "node-down", "node-up"
]


class LatencySourceStatus(BaseModel):
    job_id: str
    up: bool = Field(description="the last scrape of this replica's metrics endpoint worked")
    error: str = Field(default="", description="why not, when it did not")


class ServingSeries(BaseModel):
    deployment: str = Field(description="the serving jobs' name (a job without one: its id)")
    tenant: str
    partition: str
    slo_p99_ms: float | None = Field(description="the job's --slo-p99-ms, else its partition's")
    slo_attainment: float | None = Field(
        description="now, as on /metrics: request-weighted share of scoring windows whose p99 "
        "met the SLO, over the series retention"
    )
    request_rate: list[float | None] = Field(description="requests/s reported in the bucket")
    replicas: list[int | None] = Field(description="replicas holding GPUs, at the bucket's end")
    replicas_wanted: list[int | None] = Field(description="holding GPUs or waiting for them")
    p99_ms: list[float | None] = Field(
        description="highest p99 (over latency_window_s) sampled in the bucket"
    )
    latency_sources: list[LatencySourceStatus] = Field(
        description="the running replicas that are scraped, and how the last scrape went"
    )


class QueueDelaySeries(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    workload_class: str = Field(alias="class")
    started: list[int] = Field(description="attempts of the class started in the bucket")
    max_wait_s: list[float | None] = Field(
        description="the longest queue delay among them (null: none started)"
    )
    oldest_waiting_s: list[float | None] = Field(
        description="how long the oldest still-waiting job of the class had waited (0: none)"
    )


class LinkSeries(BaseModel):
    link: str = Field(description="'gpu<N>' for nvlink/pcie, the NIC's name for nic")
    node: str
    link_class: LinkClass
    gpu: int | None = None
    capacity_bytes_per_s: float | None = Field(
        description="bandwidth the utilisation is taken over (null: unknown, e.g. loopback)"
    )
    bytes_per_s: list[float | None] = Field(
        description="nvlink: both directions; pcie and nic: the busier direction"
    )
    utilization: list[float | None]


class GpuSeries(BaseModel):
    node: str
    gpu: int = Field(description="NVML index on its node")
    uuid: str
    utilization: list[float | None]
    memory_used_bytes: list[float | None]


class StorageSeries(BaseModel):
    node: str
    device: str = Field(description="the block device holding the data dir")
    await_s: list[float | None] = Field(description="mean wait per I/O (iostat's await)")
    busy: list[float | None] = Field(description="share of time busy (iostat's %util / 100)")


class Mark(BaseModel):
    t: float
    kind: MarkKind
    reason: str
    job_id: str | None
    message: str


class OtherTenants(BaseModel):
    serving_deployments: int = Field(description="deployments of other tenants, not shown")
    marks: int = Field(description="marks about other tenants' jobs, not shown")


class SeriesResponse(BaseModel):
    now: float = Field(description="server time of the answer (unix seconds)")
    since: float
    until: float
    step_s: float = Field(description="bucket width (never below base_step_s)")
    base_step_s: float = Field(description="how often the plane samples (series_step_s)")
    retention_s: float = Field(description="how far back the in-memory series reach")
    oldest: float | None = Field(description="the earliest point held (null: none yet)")
    t: list[float]
    serving: list[ServingSeries]
    queue_delay: list[QueueDelaySeries]
    links: list[LinkSeries]
    gpus: list[GpuSeries]
    storage: list[StorageSeries]
    marks: list[Mark] = Field(description="from the decision log (survives restarts)")
    marks_truncated: bool = Field(description="more marks than an answer holds: the newest kept")
    other_tenants: OtherTenants | None = Field(description="a tenant's answer: what it may not see")
