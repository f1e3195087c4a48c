"""Summaries of a simulation: queue delay and JCT per class (telemetry.delays), job counts.

The figures' definitions live in ``gpufence.telemetry``: queue delay and JCT over the jobs that
got there and over all jobs with the unfinished ones censored at the horizon, with counts.
"""

from __future__ import annotations

import itertools
from typing import Any

from gpufence.model.lifecycle import TERMINAL, JobState
from gpufence.sim.runner import JobTrace, SimResult
from gpufence.telemetry.capacity import allocation_ratio
from gpufence.telemetry.delays import JobTimes, completion_times, queue_delays
from gpufence.telemetry.distribution import percentile, percentiles

__all__ = ["decision_line", "decision_text", "percentile", "percentiles", "summarize"]

ENDED = TERMINAL - {JobState.DONE}  # ended without completing


def job_times(tr: JobTrace) -> JobTimes:
    """A simulated job as telemetry sees it."""
    return JobTimes(
        cls=str(tr.item.job.workload_class),
        submitted=tr.submitted,
        started=tr.first_start,
        completed=tr.end if tr.state is JobState.DONE else None,
        ended=tr.state in ENDED,
    )


def summarize(result: SimResult, total_gpus: int, horizon: float | None = None) -> dict[str, Any]:
    """Counts and delays of a run; ``horizon`` (default: the run's end) censors the jobs that
    were still waiting or running."""
    end = result.end_time if horizon is None else horizon
    states: dict[str, int] = {}
    for tr in result.jobs.values():
        states[tr.state] = states.get(tr.state, 0) + 1
    times = [job_times(tr) for tr in result.jobs.values()]
    qd = queue_delays(times, end)
    jct = completion_times(times, end)
    span = max(result.end_time, 1e-9)
    return {
        "submitted": len(result.jobs),
        "completed": states.get(JobState.DONE, 0),
        "rejected": states.get(JobState.REJECTED, 0),
        "pending_at_end": states.get(JobState.PENDING, 0),
        "states": dict(sorted(states.items())),
        "queue_delay_s": qd["started"],
        "queue_delay_all_s": qd["all"],
        "jct_s": jct["completed"],
        "jct_all_s": jct["all"],
        "gpu": {
            "allocation_ratio": round(
                allocation_ratio(result.gpu_seconds_allocated, total_gpus * span), 4
            )
        },
        "preemptions": result.counters.get("preemptions", {}),
        "reclaims": result.counters.get("reclaims", {}),
        "invariant_violations": result.invariant_violations,
        "end_time_s": round(result.end_time, 3),
        "steps": result.steps,
    }


def decision_text(d: object) -> str:
    """A decision as ``Name field=value ...`` (no timestamp): the events.csv column."""
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
    return " ".join([name, *parts])


def decision_line(t: float, d: object) -> str:
    """One stable, human-readable line per decision (golden logs, event dumps)."""
    return f"{t:10.3f} {decision_text(d)}"


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
