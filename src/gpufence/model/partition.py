"""Partitions (fences), queues and the policies attached to them."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gpufence.model.job import WorkloadClass


class SharingMode(StrEnum):
    EXCLUSIVE = "exclusive"  # one job per GPU
    MIG = "mig"  # GPUs in MIG mode; jobs take MIG instances
    FRACTIONAL = "fractional"  # milli-GPU shares with GPU memory
    TIME_SLICE = "time-slice"  # up to ``time_slice_max`` jobs per GPU, co-location recorded


class PreemptionMode(StrEnum):
    OFF = "off"
    INCIDENT_ONLY = "incident-only"  # budgeted, min-runtime, checkpointable victims only
    ON_DEMAND = "on-demand"  # the anti-pattern: serving preempts whenever it needs GPUs


DEFAULT_LOG_LIMIT = 1 << 30
"""A member's log cap (each of stdout, stderr) where the partition names none: 1 GiB."""


@dataclass(frozen=True, slots=True)
class MigConfig:
    layout: tuple[str, ...] = ()  # profiles per GPU ("name" or "name@start"); () = none created
    dynamic: bool = False  # may re-partition idle GPUs to fit pending demand
    reconfigure_delay_s: float = 60.0
    # whether a GPU may be re-cut around the instances jobs run on (NVML keeps them; the GPU
    # operator's MIG manager re-creates every instance of a GPU it re-cuts, so on Kubernetes
    # only a GPU with no running instance is re-cut)
    recut_busy: bool = True
    # MIG defragmentation by stopping (sched/migdefrag_stop.py): checkpointable jobs whose
    # instances block a waiting multi-slice profile on the GPU drained for it may be noticed and
    # stopped (then requeued), at most ``defrag_budget`` per ``defrag_window_s`` in this
    # partition. Its own budget, not the fence's incident preemption budget: serving's
    # protection never competes with re-packing. 0 = drain by attrition only.
    defrag_budget: int = 0
    defrag_window_s: float = 86400.0
    defrag_grace_s: float = 120.0  # how long a defrag victim has to checkpoint


@dataclass(frozen=True, slots=True)
class LendingRule:
    """Idle capacity of the owning partition that ``to`` partitions may borrow."""

    to: tuple[str, ...]
    cap_gpus: int  # at most this many GPUs lent out at once
    reclaim_deadline_s: float = 120.0  # borrowers get this long to checkpoint when reclaimed
    checkpointable_only: bool = True


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    mode: PreemptionMode = PreemptionMode.OFF
    from_partitions: tuple[str, ...] = ()  # where serving may take GPUs from in an incident
    budget: int = 0  # preemptions allowed per window
    window_s: float = 86400.0
    min_runtime_s: float = 600.0  # never preempt a job younger than this (no thrash)
    grace_s: float = 120.0  # wait this long for a checkpoint acknowledgement


@dataclass(frozen=True, slots=True)
class ReclaimPolicy:
    """Idle interactive sessions: warn, then reclaim."""

    idle_threshold: float = 0.05  # activity (GPU utilisation 0..1) below this counts as idle
    idle_after_s: float = 1800.0
    warning_s: float = 300.0


@dataclass(frozen=True, slots=True)
class ServingSlo:
    """The latency objective a serving partition promises (read by advice, not by the scheduler).

    ``window_s`` is the window the p99 is judged over: capacity that comes back later than that
    (a lent GPU's reclaim) misses at least one whole window.
    """

    p99_ms: float
    window_s: float = 300.0
    contractual: bool = False  # promised to customers (an SLA), not only an internal target


@dataclass(frozen=True, slots=True)
class Partition:
    name: str
    admits: frozenset[WorkloadClass]
    sharing: SharingMode = SharingMode.EXCLUSIVE
    time_slice_max: int = 1
    mig: MigConfig | None = None
    lending: tuple[LendingRule, ...] = ()
    preemption: PreemptionPolicy = field(default_factory=PreemptionPolicy)
    reclaim: ReclaimPolicy | None = None
    placement: str = "best-fit"  # placement policy for fractional requests (sched/registry.py)
    backfill: bool = True
    queue_order: str = "fair-share"  # how pending jobs are ranked (sched/registry.py)
    slo: ServingSlo | None = None  # serving partitions only
    log_limit_bytes: int = DEFAULT_LOG_LIMIT
    """Each member's stdout and stderr are cut past this (a submit may ask for less)."""


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A tenant's queue inside one partition; all queues of a partition form its cohort."""

    name: str
    partition: str
    tenant: str = ""
    weight: float = 1.0
    nominal_milli: int | None = None  # nominal quota in milli-GPU; None = no quota
    borrowing_limit_milli: int | None = None  # None = may borrow all the cohort lends
    lending_limit_milli: int | None = None  # None = lends all its unused nominal quota
