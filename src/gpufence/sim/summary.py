"""Summaries of a simulation: queue delay and JCT percentiles per class, counts, utilisation."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from gpufence.model.lifecycle import JobState
from gpufence.sim.runner import SimResult


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (numpy's linear interpolation); 0 for no values."""
    return float(np.percentile(np.asarray(values, dtype=float), p)) if values else 0.0


def _pcts(values: list[float], which: tuple[int, ...] = (50, 95, 99)) -> dict[str, float]:
    if not values:
        return {f"p{p}": 0.0 for p in which} | {"max": 0.0}
    arr = np.asarray(values, dtype=float)
    out = {f"p{p}": round(float(np.percentile(arr, p)), 3) for p in which}
    out["max"] = round(float(arr.max()), 3)
    return out


def summarize(result: SimResult, total_gpus: int) -> dict[str, Any]:
    delays: dict[str, list[float]] = {"all": []}
    jcts: dict[str, list[float]] = {"all": []}
    states: dict[str, int] = {}
    for tr in result.jobs.values():
        cls = str(tr.item.job.workload_class)
        states[tr.state] = states.get(tr.state, 0) + 1
        if tr.first_start is not None:
            d = tr.first_start - tr.submitted
            delays.setdefault(cls, []).append(d)
            delays["all"].append(d)
        if tr.state is JobState.DONE and tr.end is not None:
            j = tr.end - tr.submitted
            jcts.setdefault(cls, []).append(j)
            jcts["all"].append(j)
    span = max(result.end_time, 1e-9)
    return {
        "submitted": len(result.jobs),
        "completed": states.get(JobState.DONE, 0),
        "rejected": states.get(JobState.REJECTED, 0),
        "states": dict(sorted(states.items())),
        "queue_delay_s": {k: _pcts(v) for k, v in sorted(delays.items())},
        "jct_s": {k: _pcts(v) for k, v in sorted(jcts.items())},
        "gpu": {"allocation_ratio": round(result.gpu_seconds_allocated / (total_gpus * span), 4)},
        "preemptions": result.counters.get("preemptions", {}),
        "reclaims": result.counters.get("reclaims", {}),
        "invariant_violations": result.invariant_violations,
        "end_time_s": round(result.end_time, 3),
        "steps": result.steps,
    }


def decision_line(t: float, d: object) -> str:
    """One stable, human-readable line per decision (golden logs, event dumps)."""
    name = type(d).__name__
    fields = getattr(d, "__slots__", ())
    parts = []
    for f in fields:
        v = getattr(d, f)
        if f == "assignments":
            v = ";".join(
                f"n{a.node}:"
                + ",".join(map(str, a.gpus))
                + (f"/{a.mig_profile}@{a.mig_start}" if a.mig_profile else "")
                + (f"/{a.milli}m" if a.milli != 1000 else "")
                + ("/ts" if a.time_sliced else "")
                for a in v
            )
        elif hasattr(v, "value"):
            v = v.value
        if v in (None, "", ()):
            continue
        parts.append(f"{f}={v}")
    return f"{t:10.3f} {name} " + " ".join(parts)


def exclusive_overlap(result: SimResult) -> int:
    """Most jobs holding one GPU exclusively at the same instant (must be 1)."""
    events: list[tuple[float, int, int]] = []
    for o in result.occupancy:
        if not o.exclusive:
            continue
        end = o.end if o.end is not None else result.end_time
        for g in o.gpus:
            events += [(o.start, 1, g), (end, -1, g)]
    events.sort(key=lambda e: (e[0], e[1]))  # releases before acquisitions at the same time
    held: dict[int, int] = {}
    worst = 0
    for _, delta, g in events:
        held[g] = held.get(g, 0) + delta
        worst = max(worst, held[g])
    return worst


def handoff_gaps(result: SimResult) -> list[float]:
    """Per GPU: next job's start minus the previous job's end, for back-to-back exclusive use."""
    per_gpu: dict[int, list[tuple[float, float]]] = {}
    for o in result.occupancy:
        if o.exclusive and o.end is not None:
            for g in o.gpus:
                per_gpu.setdefault(g, []).append((o.start, o.end))
    gaps: list[float] = []
    for spans in per_gpu.values():
        spans.sort()
        gaps += [b[0] - a[1] for a, b in itertools.pairwise(spans)]
    return gaps
