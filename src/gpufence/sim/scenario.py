"""Scenario YAML: which cluster, how long, and the generated workload (serving, training,
notebooks, batch, failures). Validated with pydantic; errors name the field like cluster specs.

```yaml
name: mixed-256
cluster: mixed-256-cluster.yaml      # relative to this file
horizon_s: 172800                    # simulated time
seed: 7
services:                            # serving, autoscaled inside the fence
  - name: chat
    partition: serving
    queue: online                    # optional
    slo_p99_ms: 300
    gpus_per_replica: 1
    service_ms: 40                   # mean per-request service time on one replica
    service_cv: 1.0
    min_replicas: 8
    max_replicas: 200
    target_utilization: 0.6
    demand:
      diurnal: {base_rps: 300, peak_rps: 1200, peak_hour: 15, width_h: 4}
      bursts: [{at_s: 72000, duration_s: 1800, factor: 1.5}]
training: {arrivals_per_hour: 20, gang_sizes: {1: 0.4, 8: 0.4, 64: 0.2},
           allreduce_gb: 40, compute_s: 1.0, ...}
notebooks: {sessions_per_hour: 6, mig_profile: 1g.10gb, ...}
batch: {jobs_per_hour: 12, gpus: 1, ...}
failures: {node_mtbf_h: 500, repair_s: 3600}
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpufence.spec import SpecError

Pos = Annotated[float, Field(gt=0)]
NonNeg = Annotated[float, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Diurnal(_Strict):
    base_rps: NonNeg
    peak_rps: NonNeg
    peak_hour: Annotated[float, Field(ge=0, lt=24)] = 15.0
    width_h: Pos = 4.0  # standard deviation of the daily peak (hours)


class Burst(_Strict):
    at_s: NonNeg
    duration_s: Pos
    factor: Pos


class Demand(_Strict):
    diurnal: Diurnal | None = None
    bursts: list[Burst] = []
    trace: str | None = None  # "azure-llm:PATH", "sd:PATH" (loaders in sim.workloads)
    scale: Pos = 1.0
    bin_s: Pos = 60.0

    @model_validator(mode="after")
    def _one_source(self) -> Demand:
        if (self.diurnal is None) == (self.trace is None):
            raise ValueError("give exactly one of diurnal or trace")
        return self


class Service(_Strict):
    name: str
    partition: str = "serving"
    queue: str = ""
    slo_p99_ms: Pos
    gpus_per_replica: Annotated[int, Field(ge=1)] = 1
    service_ms: Pos
    service_cv: NonNeg = 1.0
    min_replicas: Annotated[int, Field(ge=0)] = 1
    max_replicas: Annotated[int, Field(ge=1)] = 1000
    target_utilization: Annotated[float, Field(gt=0, le=1)] = 0.6
    autoscale_every_s: Pos = 60.0
    priority: int = 100
    # share of a request's service time that moves data over its node's NIC / PCIe path,
    # stretched by gang all-reduce bursts on shared uplinks (sim.contention) [I]
    network_share: Annotated[float, Field(ge=0, le=1)] = 0.25
    demand: Demand

    @model_validator(mode="after")
    def _bounds(self) -> Service:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        return self


class Duration(_Strict):
    """Lognormal run times; the default is fitted to Philly (median 1,186 s, mean 14,613 s,
    research/traces.md §2.4): sigma = sqrt(2 ln(mean/median)) = 2.24."""

    median_s: Pos = 1186.0
    sigma: NonNeg = 2.24
    scale: Pos = 1.0
    min_s: Pos = 60.0
    max_s: Pos = 7 * 86400.0


class Training(_Strict):
    arrivals_per_hour: NonNeg = 10.0
    gang_sizes: dict[int, NonNeg] = {1: 0.5, 2: 0.1, 4: 0.1, 8: 0.15, 16: 0.08, 32: 0.05, 64: 0.02}
    duration: Duration = Duration()
    checkpointable: Annotated[float, Field(ge=0, le=1)] = 0.8
    checkpoint_every_s: Pos = 1800.0
    with_estimates: Annotated[float, Field(ge=0, le=1)] = 0.5
    queues: list[str] = []
    partition: str = "training"
    # each iteration of a multi-GPU gang: compute_s of compute, then a ring all-reduce of
    # allreduce_gb (1e9 bytes) of gradients (sim.fabric) — by default the bf16 gradients of an
    # 8B-parameter data-parallel model every second of compute [I]
    allreduce_gb: NonNeg = 16.0
    compute_s: Pos = 1.0

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: object) -> object:
        if isinstance(data, dict) and ({"comm_gbps_per_gpu", "comm_duty"} & set(data)):
            raise ValueError(
                "comm_gbps_per_gpu / comm_duty were replaced by the all-reduce model: give"
                " allreduce_gb (gradient bytes per iteration, GB) and compute_s (compute per"
                " iteration, s)"
            )
        return data

    @model_validator(mode="after")
    def _sizes(self) -> Training:
        bad = [s for s in self.gang_sizes if s < 1 or (s > 8 and s % 8)]
        if bad:
            raise ValueError(f"gang_sizes {bad}: use 1..8 or multiples of 8 (whole nodes)")
        if self.gang_sizes and sum(self.gang_sizes.values()) <= 0:
            raise ValueError("gang_sizes weights must not all be 0")
        return self


class Notebooks(_Strict):
    sessions_per_hour: NonNeg = 4.0
    mig_profile: str | None = None  # None: one whole GPU
    session_s: Pos = 4 * 3600.0
    active_s: Pos = 1200.0  # mean length of an active phase
    idle_s: Pos = 2400.0  # mean length of an idle phase
    partition: str = "interactive"


class Batch(_Strict):
    jobs_per_hour: NonNeg = 10.0
    gpus: Annotated[int, Field(ge=1)] = 1
    gpu_fraction: Annotated[float, Field(gt=0, lt=1)] | None = None
    gpu_mem_gib: NonNeg = 0.0
    duration: Duration = Duration(median_s=900.0, sigma=0.8, max_s=6 * 3600.0)
    partition: str = "batch"


class Failures(_Strict):
    node_mtbf_h: Pos = 1000.0
    repair_s: Pos = 3600.0


class Scenario(_Strict):
    name: str
    cluster: str = ""  # optional: the CLI names the cluster file itself
    horizon_s: Pos
    seed: int = 0
    services: list[Service] = []
    training: Training | None = None
    notebooks: Notebooks | None = None
    batch: Batch | None = None
    failures: Failures | None = None
    sample_every_s: Pos = 300.0
    storage_gbps: Pos = 400.0  # shared checkpoint storage bandwidth
    checkpoint_gb_per_gpu: Pos = 10.0  # bytes a checkpoint writes per GPU of the job


def load_scenario(path: str | Path) -> tuple[Scenario, Path | None]:
    """The scenario and the resolved path of its cluster file."""
    p = Path(path)
    if not p.exists():
        raise SpecError([f"scenario file '{path}' not found"], source=str(path), kind="scenario")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise SpecError([f"YAML syntax error: {e}"], source=str(path), kind="scenario") from None
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"])
            lines.append(f"{loc}: {err['msg']} (got {err.get('input')!r})")
        raise SpecError(lines, source=str(path), kind="scenario") from None
    return sc, ((p.parent / sc.cluster).resolve() if sc.cluster else None)
