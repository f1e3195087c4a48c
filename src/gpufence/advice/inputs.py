"""What the rules read besides the cluster: numbers from a scenario or the history, settings.

Spec rules that need a serving peak, an SLO or a training gang size fire only when one is known:
``LintInputs`` carries them (the simulator fills it from the scenario, ``gpufence advise`` from
the control plane's history). ``AdviceSettings`` is the ``control: advice:`` section.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpufence.advice.catalog import RULES
from gpufence.model.cluster import Cluster
from gpufence.spec.errors import Path, name_list, suggest


@dataclass(frozen=True, slots=True)
class ServingPeak:
    """GPUs a serving partition's work wanted at once at its peak, and where that comes from."""

    partition: str
    gpus: float
    source: str  # e.g. "scenario: chat peaks at 600 req/s = 26 replicas for p99 <= 300 ms"


@dataclass(frozen=True, slots=True)
class SloInput:
    """A serving SLO known from outside the spec (a scenario's services), for a partition
    that declares none."""

    partition: str
    p99_ms: float
    window_s: float
    contractual: bool
    source: str


@dataclass(frozen=True, slots=True)
class GangInput:
    """The largest training gang a workload brings to a partition (generated or observed)."""

    partition: str
    gpus: int
    source: str


@dataclass(frozen=True)
class LintInputs:
    peaks: tuple[ServingPeak, ...] = ()
    slos: tuple[SloInput, ...] = ()
    gangs: tuple[GangInput, ...] = ()
    queue_index: Mapping[str, int] = field(default_factory=dict)  # name -> position in queues:
    lines: Mapping[Path, int] = field(default_factory=dict)  # field path -> source line
    failure_margin_nodes: int = 1  # node failures the serving fence must absorb
    ignore: tuple[str, ...] = ()  # rule ids not to report

    def slo(self, cluster: Cluster, partition: str) -> SloInput | None:
        """The partition's declared SLO, else one known from outside (a scenario)."""
        declared = cluster.partitions[partition].slo
        if declared is not None:
            return SloInput(
                partition,
                declared.p99_ms,
                declared.window_s,
                declared.contractual,
                f"partitions.{partition}.slo",
            )
        found = [s for s in self.slos if s.partition == partition]
        return min(found, key=lambda s: s.window_s) if found else None

    def peak(self, partition: str) -> ServingPeak | None:
        found = [p for p in self.peaks if p.partition == partition]
        return max(found, key=lambda p: p.gpus) if found else None

    def gang(self, partition: str) -> GangInput | None:
        found = [g for g in self.gangs if g.partition == partition]
        return max(found, key=lambda g: g.gpus) if found else None

    def queue_path(self, name: str, *rest: str) -> Path:
        """("queues", 1, field) when the spec position is known, else ("queues", name, field)."""
        pos = self.queue_index.get(name)
        return ("queues", pos if pos is not None else name, *rest)


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChronicPreemption(_Settings):
    """Incident preemptions on more than ``more_than`` of the last ``of_last`` periods are
    chronic. With fewer than ``of_last`` periods of history, the bar scales down (at least 1)."""

    more_than: int = Field(default=2, ge=0)
    of_last: int = Field(default=7, ge=1, le=1000)
    period_s: float = Field(default=86400.0, gt=0.0, le=365 * 86400.0, allow_inf_nan=False)


class AdviceSettings(_Settings):
    """The ``control: advice:`` section (every field optional)."""

    ignore: tuple[str, ...] = ()  # rule ids not to report (a deliberate choice, say why nearby)
    chronic_preemption: ChronicPreemption = ChronicPreemption()
    failure_margin_nodes: int = Field(default=1, ge=0, le=64)
    # a serving job that ends on its own after running this long behaves like a batch job
    batch_like_after_s: float = Field(default=600.0, gt=0.0, allow_inf_nan=False)
    # sessions in an interactive partition without reclaim held longer than this are reported
    interactive_hold_s: float = Field(default=4 * 3600.0, gt=0.0, allow_inf_nan=False)
    # borrowers losing more than this share of the GPU-hours they got on lent capacity
    lending_loss_ratio: float = Field(default=0.5, gt=0.0, le=1.0)
    # fragmentation: waiting gangs stranded for at least this share of the window ...
    stranded_share: float = Field(default=0.1, gt=0.0, le=1.0)
    stranded_min_s: float = Field(default=600.0, ge=0.0, allow_inf_nan=False)  # ... and this long

    @field_validator("ignore")
    @classmethod
    def _known(cls, ids: tuple[str, ...]) -> tuple[str, ...]:
        for rule in ids:
            if rule not in RULES:
                known = name_list(RULES, limit=32)
                raise ValueError(f"unknown rule {rule!r} (known: {known}){suggest(rule, RULES)}")
        return ids

    @property
    def window_s(self) -> float:
        """How far back the live rules look."""
        return self.chronic_preemption.of_last * self.chronic_preemption.period_s
