"""Pydantic schema of the cluster YAML: fields, defaults, selector syntax, single-item rules."""

# The cluster file, field by field (examples/*.yaml use exactly this):
#
#   name: mixed-64
#   gpu_types:                 # optional: user-defined types in addition to the built-in catalogue
#     - {name: L4-24GB, memory_gib: 24}     # optional: mig_model (a catalogue MIG model such as
#                                           #   A100-80GB, whose profiles it reuses), nvlink_gbps
#   node_groups:
#     - name: h100-a           # node names "<group>-<i>", i = 0..count-1 zero-padded to the width
#       count: 2               #   of count-1: h100-a-0 .. h100-a-1; 12 nodes give h100-a-00 .. -11
#       gpus_per_node: 8
#       gpu_type: H100-80GB    # a built-in type (spec/catalogue.py) or one declared in gpu_types
#       rack: rack-a           # default rack-0
#       nvlink_domains: [8]    # NVLink domain sizes on a node, summing to gpus_per_node;
#                              #   default one domain of all the node's GPUs
#       cpu_cores: 96          # per node, default 64
#       memory_gib: 1024       # host memory per node, default 512
#   fabric: {node_uplink_gbps: 400, rack_uplink_gbps: 3200}   # optional, Gbit/s
#   partitions:                # name -> partition, in order; every GPU in exactly one partition
#     serving:
#       nodes: [h100-a]        # node selectors: "GROUP" (all its nodes), "GROUP[i]" or
#                              #   "GROUP[i:j]" (python slice: j exclusive, negatives count back)
#       gpus: ["h100-b[0]:0-3"]    # GPU selectors "NODESEL:a-b" (inclusive) or "NODESEL:a": those
#                                  #   GPU indices on every node NODESEL selects
#       admits: [serving]      # non-empty subset of serving, training, interactive, batch
#       sharing: exclusive     # exclusive | mig | fractional | time-slice
#       time_slice_max: 4      # jobs per GPU; required for (and only for) time-slice, >= 2
#       mig: {layout: ["3g.40gb", "2g.20gb", "1g.10gb@6"], dynamic: false,
#             reconfigure_delay_s: 60}   # only with sharing: mig; "profile@start" pins a start
#                              #   dynamic only: defrag_budget (checkpointable jobs stopped per
#                              #   defrag_window_s to unblock a larger profile; 0 = never),
#                              #   defrag_grace_s (their time to checkpoint)
#       placement: best-fit    # fractional placement policy (sched/registry.py SCORERS)
#       queue_order: fair-share  # how pending jobs are ranked: fair-share (priority, then
#                              #   weighted fair share) or las (sched/registry.py QUEUE_ORDERS)
#       backfill: true
#       lending: [{to: [training], cap_gpus: 8, reclaim_deadline_s: 120,
#                  checkpointable_only: true}]
#       preemption: {mode: incident-only, from: [training], budget: 4, window_s: 86400,
#                    min_runtime_s: 600, grace_s: 120}   # mode: off | incident-only | on-demand
#       reclaim: {idle_threshold: 0.05, idle_after_s: 1800, warning_s: 300}  # admits interactive
#       slo: {p99_ms: 300, window_s: 300, contractual: false}   # admits serving: the latency
#                              #   objective it promises; read by `gpufence validate`'s advice
#   queues:                    # optional; a partition without queues gets one named after it
#     - {name: research, partition: training, tenant: research, weight: 2, nominal_gpus: 16,
#        borrowing_limit_gpus: 8, lending_limit_gpus: 4}      # tenant defaults to the queue name

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PlainSerializer,
    PlainValidator,
    PositiveFloat,
    PositiveInt,
    StringConstraints,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from gpufence.model.hardware import Fabric
from gpufence.model.job import MILLI_PER_GPU, WorkloadClass
from gpufence.model.partition import (
    DEFAULT_LOG_LIMIT,
    LendingRule,
    MigConfig,
    Partition,
    PreemptionMode,
    PreemptionPolicy,
    QueueSpec,
    ReclaimPolicy,
    ServingSlo,
    SharingMode,
)
from gpufence.sched import registry

NAME_RE = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
# Names end up inside selectors ("g[0:2]:0-3") and node names, so brackets, colons and spaces
# are kept out of them.
Name = Annotated[str, StringConstraints(pattern=f"^{NAME_RE}$")]


def _registered(kind: str) -> Any:
    """A validator for the name of a registered scheduling plugin: the registry
    (sched/registry.py) is the only list of valid names; a wrong one fails like a literal,
    naming the valid ones."""

    def check(value: object) -> str:
        valid = registry.names(kind)
        if not isinstance(value, str) or value not in valid:
            expected = ", ".join(repr(n) for n in valid)
            raise PydanticCustomError(
                "literal_error", "Input should be one of {expected}", {"expected": expected}
            )
        return value

    return PlainValidator(check)


PlacementName = Annotated[
    str,
    _registered("placement policy"),
    WithJsonSchema({"enum": list(registry.names("placement policy"))}),
]
QueueOrderName = Annotated[
    str,
    _registered("queue order"),
    WithJsonSchema({"enum": list(registry.names("queue order"))}),
]

_NODE_SEL_RE = re.compile(
    rf"^(?P<group>{NAME_RE})(?:\[(?:(?P<idx>-?\d+)|(?P<a>-?\d+)?(?P<colon>:)(?P<b>-?\d+)?)\])?$"
)
_GPU_RANGE_RE = re.compile(r"^(?P<first>\d+)(?:-(?P<last>\d+))?$")
_NODE_SEL_FORMS = "GROUP, GROUP[i] or GROUP[i:j]"


@dataclass(frozen=True, slots=True)
class NodeSelector:
    """Nodes of one group: all of them, one index, or a python-style slice."""

    group: str
    index: int | None = None  # GROUP[i]
    is_slice: bool = False  # GROUP[start:stop]
    start: int | None = None
    stop: int | None = None

    def __str__(self) -> str:
        if self.index is not None:
            return f"{self.group}[{self.index}]"
        if self.is_slice:
            a = "" if self.start is None else str(self.start)
            b = "" if self.stop is None else str(self.stop)
            return f"{self.group}[{a}:{b}]"
        return self.group

    def resolve(self, count: int) -> range:
        """Positions within a group of ``count`` nodes; ValueError says what is out of range."""
        span = f"group {self.group!r} has {count} node{'s' if count != 1 else ''}: 0..{count - 1}"
        if self.index is not None:
            if not -count <= self.index < count:
                raise ValueError(f"node index {self.index} is out of range ({span})")
            return range(count)[self.index : self.index + 1 or None]
        if self.is_slice:
            # Python would clip an oversized slice silently; in a spec that hides a typo.
            for bound in (self.start, self.stop):
                if bound is not None and not -count <= bound <= count:
                    raise ValueError(f"slice bound {bound} is out of range ({span})")
            picked = range(count)[self.start : self.stop]
            if not picked:
                raise ValueError(f"slice selects no nodes ({span})")
            return picked
        return range(count)


@dataclass(frozen=True, slots=True)
class GpuSelector:
    """GPU indices ``first..last`` (inclusive) on every node that ``nodes`` selects."""

    nodes: NodeSelector
    first: int
    last: int

    def __str__(self) -> str:
        gpus = str(self.first) if self.first == self.last else f"{self.first}-{self.last}"
        return f"{self.nodes}:{gpus}"


def parse_node_selector(text: str) -> NodeSelector:
    m = _NODE_SEL_RE.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a node selector (expected {_NODE_SEL_FORMS})")
    group = m["group"]
    if m["colon"]:
        start = int(m["a"]) if m["a"] is not None else None
        stop = int(m["b"]) if m["b"] is not None else None
        return NodeSelector(group, is_slice=True, start=start, stop=stop)
    if m["idx"] is not None:
        return NodeSelector(group, index=int(m["idx"]))
    return NodeSelector(group)


def parse_gpu_selector(text: str) -> GpuSelector:
    node_text, sep, gpu_text = text.rpartition(":")
    m = _GPU_RANGE_RE.match(gpu_text)
    if not sep or m is None:
        raise ValueError(
            f"{text!r} is not a GPU selector (expected NODESEL:a-b or NODESEL:a, "
            f"NODESEL one of {_NODE_SEL_FORMS}, e.g. 'h100-b[0]:0-3')"
        )
    first = int(m["first"])
    last = int(m["last"]) if m["last"] is not None else first
    if last < first:
        raise ValueError(f"{text!r}: GPU range {first}-{last} is backwards (write {last}-{first})")
    return GpuSelector(parse_node_selector(node_text), first, last)


def _selector_validator(parse: Any) -> PlainValidator:
    def check(value: object) -> object:
        if isinstance(value, NodeSelector | GpuSelector):
            return value
        if not isinstance(value, str):
            raise ValueError(f"{value!r} is not a selector string")
        return parse(value)

    return PlainValidator(check)


_AS_STRING = (PlainSerializer(str), WithJsonSchema({"type": "string"}))
NodeSel = Annotated[NodeSelector, _selector_validator(parse_node_selector), *_AS_STRING]
GpuSel = Annotated[GpuSelector, _selector_validator(parse_gpu_selector), *_AS_STRING]


def _yaml11_off(value: object) -> object:
    # YAML 1.1 loaders (and json-ish callers) turn a bare `off` into False.
    return PreemptionMode.OFF.value if value is False else value


class _Spec(BaseModel):
    # (YAML's .inf / .nan are floats too: no field means "unlimited" by one, and an infinite
    # quota or deadline broke the checks built on it with a traceback, not a message)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


_FABRIC = Fabric()
_MIG = MigConfig()
_PREEMPT = PreemptionPolicy()
_RECLAIM = ReclaimPolicy()


class GpuTypeSchema(_Spec):
    name: Name
    memory_gib: PositiveFloat
    mig_model: str | None = None
    nvlink_gbps: NonNegativeFloat = 0.0


class NodeGroupSchema(_Spec):
    name: Name
    count: PositiveInt
    gpus_per_node: PositiveInt
    gpu_type: str
    rack: Name = "rack-0"
    nvlink_domains: tuple[PositiveInt, ...] | None = None
    cpu_cores: PositiveInt = 64
    memory_gib: PositiveInt = 512


class FabricSchema(_Spec):
    node_uplink_gbps: PositiveFloat = _FABRIC.node_uplink_gbps
    rack_uplink_gbps: PositiveFloat = _FABRIC.rack_uplink_gbps


class MigSchema(_Spec):
    layout: tuple[str, ...] = ()
    dynamic: bool = False
    reconfigure_delay_s: NonNegativeFloat = _MIG.reconfigure_delay_s
    defrag_budget: NonNegativeInt = _MIG.defrag_budget
    defrag_window_s: PositiveFloat = _MIG.defrag_window_s
    defrag_grace_s: NonNegativeFloat = _MIG.defrag_grace_s


class LendingSchema(_Spec):
    to: tuple[Name, ...] = Field(min_length=1)
    cap_gpus: PositiveInt
    reclaim_deadline_s: NonNegativeFloat = 120.0
    checkpointable_only: bool = True


class PreemptionSchema(_Spec):
    mode: Annotated[PreemptionMode, BeforeValidator(_yaml11_off)] = PreemptionMode.OFF
    from_: tuple[Name, ...] = Field(default=(), alias="from")
    budget: NonNegativeInt = _PREEMPT.budget
    window_s: PositiveFloat = _PREEMPT.window_s
    min_runtime_s: NonNegativeFloat = _PREEMPT.min_runtime_s
    grace_s: NonNegativeFloat = _PREEMPT.grace_s


class ReclaimSchema(_Spec):
    idle_threshold: Annotated[float, Field(ge=0.0, le=1.0)] = _RECLAIM.idle_threshold
    idle_after_s: PositiveFloat = _RECLAIM.idle_after_s
    warning_s: NonNegativeFloat = _RECLAIM.warning_s


class SloSchema(_Spec):
    p99_ms: PositiveFloat
    window_s: PositiveFloat = 300.0
    contractual: bool = False


Problems = list[tuple[tuple[str, ...], str]]  # (field path relative to the item, message)


class PartitionFence(BaseModel):
    """Only the selectors of a partition: enough to check fences when its other fields are bad."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    nodes: tuple[NodeSel, ...] = ()
    gpus: tuple[GpuSel, ...] = ()


class PartitionSchema(PartitionFence):
    model_config = ConfigDict(extra="forbid", frozen=True)

    admits: tuple[WorkloadClass, ...] = Field(min_length=1)
    sharing: SharingMode = SharingMode.EXCLUSIVE
    time_slice_max: int | None = None  # range checked in local_problems, knowing the sharing
    mig: MigSchema | None = None
    placement: PlacementName = "best-fit"
    queue_order: QueueOrderName = "fair-share"
    backfill: bool = True
    lending: tuple[LendingSchema, ...] = ()
    preemption: PreemptionSchema | None = None
    reclaim: ReclaimSchema | None = None
    slo: SloSchema | None = None
    log_limit_mib: int = Field(default=DEFAULT_LOG_LIMIT >> 20, ge=1, le=1 << 20)
    """Each member's stdout and stderr are cut past this many MiB (``--log-limit`` lowers it)."""

    def local_problems(self) -> Problems:
        """Contradictions inside this partition alone (rules needing other items live in build)."""
        out: Problems = []
        mode = f"(sharing is {self.sharing.value!r})"
        tsm, ts = self.time_slice_max, self.sharing is SharingMode.TIME_SLICE
        if ts and tsm is None:
            out.append((("time_slice_max",), "required with sharing: time-slice (>= 2)"))
        elif ts and tsm is not None and tsm < 2:
            why = "time-slice shares a GPU among at least 2 jobs (exclusive gives 1 job per GPU)"
            out.append((("time_slice_max",), f"{tsm} is not valid: {why}"))
        elif not ts and tsm is not None:
            out.append((("time_slice_max",), f"only applies to sharing: time-slice {mode}"))
        if self.mig is not None and self.sharing is not SharingMode.MIG:
            out.append((("mig",), f"only applies to sharing: mig {mode}; remove it"))
        mig = self.mig or MigSchema()
        if self.sharing is SharingMode.MIG and not mig.layout and not mig.dynamic:
            msg = "an empty mig.layout with dynamic: false creates no MIG instances, so no job "
            msg += "could ever run; give mig.layout or set mig.dynamic: true"
            out.append((("mig",) if self.mig else ("sharing",), msg))
        if mig.defrag_budget and not mig.dynamic:
            msg = "mig.defrag_budget stops jobs so that a GPU can be re-cut, which needs "
            msg += "mig.dynamic: true; set it or set defrag_budget: 0"
            out.append((("mig", "defrag_budget"), msg))
        pre = self.preemption
        if pre is not None and pre.mode is not PreemptionMode.OFF and not pre.from_:
            msg = f"mode {pre.mode.value!r} needs at least one partition to preempt from"
            out.append((("preemption", "from"), msg))
        if pre is not None and pre.mode is PreemptionMode.INCIDENT_ONLY and pre.budget == 0:
            msg = "0 with mode 'incident-only' allows no preemption at all "
            msg += "(set budget >= 1 per window_s, or mode: off)"
            out.append((("preemption", "budget"), msg))
        if self.reclaim is not None and WorkloadClass.INTERACTIVE not in self.admits:
            msg = "reclaims idle interactive sessions, but the partition does not admit "
            msg += f"interactive (admits: {', '.join(self.admits)}); add it or remove reclaim"
            out.append((("reclaim",), msg))
        if self.slo is not None and WorkloadClass.SERVING not in self.admits:
            msg = "is the latency objective of serving, but the partition does not admit "
            msg += f"serving (admits: {', '.join(self.admits)}); add it or remove slo"
            out.append((("slo",), msg))
        return out

    def to_model(self, name: str) -> Partition:
        pre, rec, mig = self.preemption, self.reclaim, self.mig or MigSchema()
        is_ts = self.sharing is SharingMode.TIME_SLICE
        return Partition(
            name=name,
            admits=frozenset(self.admits),
            sharing=self.sharing,
            time_slice_max=(self.time_slice_max or 1) if is_ts else 1,
            mig=(
                MigConfig(
                    mig.layout,
                    mig.dynamic,
                    mig.reconfigure_delay_s,
                    defrag_budget=mig.defrag_budget,
                    defrag_window_s=mig.defrag_window_s,
                    defrag_grace_s=mig.defrag_grace_s,
                )
                if self.sharing is SharingMode.MIG
                else None
            ),
            lending=tuple(
                LendingRule(r.to, r.cap_gpus, r.reclaim_deadline_s, r.checkpointable_only)
                for r in self.lending
            ),
            preemption=PreemptionPolicy(
                pre.mode, pre.from_, pre.budget, pre.window_s, pre.min_runtime_s, pre.grace_s
            )
            if pre is not None
            else PreemptionPolicy(),
            reclaim=ReclaimPolicy(rec.idle_threshold, rec.idle_after_s, rec.warning_s)
            if rec is not None
            else None,
            placement=self.placement,
            backfill=self.backfill,
            queue_order=self.queue_order,
            slo=ServingSlo(self.slo.p99_ms, self.slo.window_s, self.slo.contractual)
            if self.slo is not None
            else None,
            log_limit_bytes=self.log_limit_mib << 20,
        )


def _milli(gpus: float | None) -> int | None:
    return None if gpus is None else round(gpus * MILLI_PER_GPU)


class QueueSchema(_Spec):
    name: Name
    partition: Name
    tenant: Name | None = None
    weight: PositiveFloat = 1.0
    nominal_gpus: NonNegativeFloat | None = None
    borrowing_limit_gpus: NonNegativeFloat | None = None
    lending_limit_gpus: NonNegativeFloat | None = None

    def local_problems(self) -> Problems:
        """Contradictions inside this queue alone."""
        limit, nominal = self.lending_limit_gpus, self.nominal_gpus
        if limit is not None and nominal is None:
            return [(("lending_limit_gpus",), "needs nominal_gpus: a queue lends unused quota")]
        if limit is not None and nominal is not None and limit > nominal:
            msg = f"{limit:g} is more than the queue's nominal_gpus {nominal:g}"
            return [(("lending_limit_gpus",), msg)]
        return []

    def to_model(self) -> QueueSpec:
        return QueueSpec(
            name=self.name,
            partition=self.partition,
            tenant=self.tenant or self.name,
            weight=self.weight,
            nominal_milli=_milli(self.nominal_gpus),
            borrowing_limit_milli=_milli(self.borrowing_limit_gpus),
            lending_limit_milli=_milli(self.lending_limit_gpus),
        )


class ClusterSchema(_Spec):
    name: Name
    gpu_types: tuple[GpuTypeSchema, ...] = ()
    node_groups: tuple[NodeGroupSchema, ...] = Field(min_length=1)
    fabric: FabricSchema = FabricSchema()
    partitions: dict[Name, PartitionSchema] = Field(min_length=1)
    queues: tuple[QueueSchema, ...] = ()
