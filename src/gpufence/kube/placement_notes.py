"""What gpufence writes through a binding, and reads back after a restart.

The API server is the store in Kubernetes mode: a bound pod carries the core's whole view of
its placement (partition, lent-from, attempt, bind time, the GPU assignment, and for a gang the
plan of every member), written atomically with the bind itself -- the ``pods/binding``
subresource copies the binding's annotations onto the pod in the same write. A restarted
scheduler therefore rebuilds each running job exactly, and can finish binding a gang that a
crash left half bound (roll forward: the plan in a bound member says where the rest go).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpufence.kube import names
from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Assignment


@dataclass(frozen=True, slots=True)
class MemberPlan:
    pod: str  # pod name (the namespace is the job's)
    node: str
    gpus: tuple[int, ...]  # GPU indices on the node
    milli: int = 1000
    gpu_mem_mib: int = 0
    mig_profile: str | None = None
    mig_start: int | None = None
    time_sliced: bool = False

    def encode(self) -> dict[str, object]:
        out: dict[str, object] = {"pod": self.pod, "node": self.node, "gpus": list(self.gpus)}
        if self.milli != 1000:
            out["milli"] = self.milli
        if self.gpu_mem_mib:
            out["mem"] = self.gpu_mem_mib
        if self.mig_profile is not None:
            out["mig"] = self.mig_profile
            out["start"] = self.mig_start
        if self.time_sliced:
            out["ts"] = True
        return out

    @staticmethod
    def decode(raw: Mapping[str, object]) -> MemberPlan:
        gpus = raw.get("gpus")
        if not isinstance(gpus, list) or not all(isinstance(g, int) for g in gpus):
            raise ValueError("gpus: a list of GPU indices")
        start = raw.get("start")
        mig = raw.get("mig")
        return MemberPlan(
            pod=str(raw["pod"]),
            node=str(raw["node"]),
            gpus=tuple(gpus),
            milli=int(str(raw.get("milli", 1000))),
            gpu_mem_mib=int(str(raw.get("mem", 0))),
            mig_profile=None if mig is None else str(mig),
            mig_start=None if start is None else int(str(start)),
            time_sliced=bool(raw.get("ts", False)),
        )


@dataclass(frozen=True, slots=True)
class BindNote:
    """The annotations of one bind: the job's placement as the core made it."""

    job_id: str
    partition: str
    lent_from: str | None
    attempt: int
    bound_at: float
    plan: tuple[MemberPlan, ...]  # every member, in replica order

    def annotations(self, pod: str | None = None) -> dict[str, str]:
        """The note, and for ``pod`` its own GPU indices (``gpufence.io/gpus: "0,1"``: what
        ``kubectl describe`` shows, and what a device plugin honouring gpufence would read)."""
        out = {
            names.ANN_JOB: self.job_id,
            names.ANN_BOUND_PARTITION: self.partition,
            names.ANN_ATTEMPT: str(self.attempt),
            names.ANN_BOUND_AT: f"{self.bound_at:.3f}",
            names.ANN_GANG_PLAN: json.dumps([m.encode() for m in self.plan], separators=(",", ":")),
        }
        if self.lent_from:
            out[names.ANN_LENT_FROM] = self.lent_from
        member = next((m for m in self.plan if m.pod == pod), None)
        if member is not None:
            out[names.ANN_GPUS] = ",".join(str(g) for g in member.gpus)
        return out

    @staticmethod
    def read(annotations: Mapping[str, str]) -> BindNote | None:
        """The note a bound pod carries; None if it has none or a damaged one (a pod bound
        by hand or by an older version: it is then left alone, counted as foreign usage)."""
        try:
            plan_raw = json.loads(annotations[names.ANN_GANG_PLAN])
            plan = tuple(MemberPlan.decode(m) for m in plan_raw)
            note = BindNote(
                job_id=annotations[names.ANN_JOB],
                partition=annotations[names.ANN_BOUND_PARTITION],
                lent_from=annotations.get(names.ANN_LENT_FROM) or None,
                attempt=int(annotations.get(names.ANN_ATTEMPT, "1")),
                bound_at=float(annotations[names.ANN_BOUND_AT]),
                plan=plan,
            )
        # (RecursionError: JSON nested past the parser's depth)
        except (KeyError, ValueError, TypeError, AttributeError, RecursionError, OverflowError):
            return None
        # what a bind writes: a plan of one pod or more, a first attempt or later, a clock time
        sane = note.plan and note.attempt >= 1 and math.isfinite(note.bound_at)
        return note if sane else None


def plan_of(
    cluster: Cluster, pods: Sequence[str], assignments: Sequence[Assignment]
) -> tuple[MemberPlan, ...]:
    """The core's assignments (replica i -> pods[i]) in node names and local GPU indices."""
    out = []
    for pod, a in zip(pods, assignments, strict=True):
        out.append(
            MemberPlan(
                pod=pod,
                node=cluster.nodes[a.node].name,
                gpus=tuple(cluster.gpus[g].index for g in a.gpus),
                milli=a.milli,
                gpu_mem_mib=a.gpu_mem_mib,
                mig_profile=a.mig_profile,
                mig_start=a.mig_start,
                time_sliced=a.time_sliced,
            )
        )
    return tuple(out)


def assignments_of(cluster: Cluster, plan: Sequence[MemberPlan]) -> tuple[Assignment, ...] | None:
    """Back to the core's terms; None when a node or GPU of the plan is not in the model any
    more (the node left, or lost GPUs): the job cannot be restored where it runs."""
    out = []
    for m in plan:
        idx = cluster.node_by_name.get(m.node)
        if idx is None:
            return None
        # by each GPU's own index (a DRA node's model leaves out the devices others hold)
        by_index = {cluster.gpus[g].index: g for g in cluster.nodes[idx].gpu_ids}
        if any(k not in by_index for k in m.gpus):
            return None
        out.append(
            Assignment(
                node=idx,
                gpus=tuple(by_index[k] for k in m.gpus),
                milli=m.milli,
                gpu_mem_mib=m.gpu_mem_mib,
                mig_profile=m.mig_profile,
                mig_start=m.mig_start,
                time_sliced=m.time_sliced,
            )
        )
    return tuple(out)
