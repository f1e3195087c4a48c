"""Preemptions, reclaims and lost work: which stop reasons count as what, and in what unit.

* a **preemption** is a stop for incident or on-demand preemption (checkpointable work stopped
  for serving); a **reclaim** takes capacity back (lent capacity, idle notebooks);
* **GPU-hours lost** = for every attempt stopped before completing (preempted, lent capacity
  reclaimed, killed by a node failure), the GPU-seconds since its last checkpoint (or its
  start), in hours. Node failures count: the work is lost all the same (issue 14). Not counted:
  an idle notebook reclaimed (it was doing nothing) and serving replicas (stateless: a
  replacement serves the same requests).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpufence.model.decisions import Reason

# (a MIG defrag stop is a budgeted preemption too: sched/migdefrag_stop.py)
PREEMPTION_REASONS = (
    str(Reason.INCIDENT_PREEMPTION),
    str(Reason.ON_DEMAND_PREEMPTION),
    str(Reason.MIG_DEFRAG),
)
RECLAIM_REASONS = (str(Reason.LENT_RECLAIM), str(Reason.IDLE))
FAILURE_REASONS = (str(Reason.NODE_FAILURE),)


NO_LOSS_REASONS = frozenset({str(Reason.IDLE)})
NO_LOSS_CLASSES = frozenset({"serving"})


def counts_as_loss(workload_class: str, reason: str) -> bool:
    """Whether stopping a running attempt of this class for this reason loses work."""
    return workload_class not in NO_LOSS_CLASSES and reason not in NO_LOSS_REASONS


def loss_cause(reason: str) -> str:
    """The ``gpu_hours_lost.by_cause`` key of a stop reason."""
    if reason in PREEMPTION_REASONS:
        return "preemption"
    if reason in FAILURE_REASONS:
        return "node_failure"
    if reason in RECLAIM_REASONS:
        return "reclaim"
    return "other"


def gpu_hours(gpu_seconds: float) -> float:
    return gpu_seconds / 3600.0


def lost_gpu_hours(lost_gpu_s: Iterable[tuple[str, float]]) -> dict[str, float]:
    """``{cause: GPU-hours}`` from (stop reason, GPU-seconds lost) pairs, plus ``total``."""
    out: dict[str, float] = {}
    for reason, secs in lost_gpu_s:
        cause = loss_cause(reason)
        out[cause] = out.get(cause, 0.0) + gpu_hours(secs)
    out["total"] = sum(out.values())
    return out


def counted(by_reason: Mapping[str, int], reasons: Iterable[str]) -> int:
    return sum(int(by_reason.get(r, 0)) for r in reasons)
