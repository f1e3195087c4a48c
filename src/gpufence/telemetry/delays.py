"""Queue delay and job completion time, with the jobs that never got there counted.

Definitions (the same in ``metrics.json`` and on ``/metrics``):

* **queue delay** = first start − submit. The control plane also observes each later attempt
  from its requeue (``attempt_wait_s``).
* **JCT** = completion − submit, for jobs that completed.

Counting only the jobs that started (or completed) leaves out exactly the ones that waited
longest: survivorship bias. So each figure is reported twice: over the jobs that got there
(``started`` / ``completed``) and over **all** jobs, where one still waiting (or still running)
at the horizon counts with horizon − submit, a lower bound on its real value, and is counted in
``censored``. Jobs that ended without getting there (cancelled while pending, rejected) are in
neither; serving replicas never complete, so they have no JCT.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpufence.telemetry.distribution import percentiles

NO_JCT_CLASSES = frozenset({"serving"})  # long-running services: no completion time


@dataclass(frozen=True, slots=True)
class JobTimes:
    """What the definitions need of one job."""

    cls: str  # workload class
    submitted: float
    started: float | None  # first start
    completed: float | None  # completion time (None: not completed)
    ended: bool  # ended without completing (cancelled, rejected, failed, reclaimed)


def attempt_wait_s(pending_since: float, started: float) -> float:
    """Wait of one attempt: from submit (or requeue) to its start; never negative."""
    return max(0.0, started - pending_since)


def _add(table: dict[str, list[float]], cls: str, value: float) -> None:
    table.setdefault(cls, []).append(value)
    table.setdefault("all", []).append(value)


def _summaries(
    values: dict[str, list[float]], censored: dict[str, int] | None
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for cls in sorted(values):
        entry: dict[str, Any] = dict(percentiles(values[cls]))
        entry["n"] = len(values[cls])
        if censored is not None:
            entry["censored"] = censored.get(cls, 0)
        out[cls] = entry
    return out


def queue_delays(jobs: Iterable[JobTimes], horizon: float) -> dict[str, dict[str, Any]]:
    """``{"started": {CLASS: {p50, p95, p99, max, n}}, "all": {CLASS: {..., censored}}}``."""
    started: dict[str, list[float]] = {"all": []}
    everyone: dict[str, list[float]] = {"all": []}
    censored: dict[str, int] = {}
    for j in jobs:
        if j.started is not None:
            d = j.started - j.submitted
            _add(started, j.cls, d)
            _add(everyone, j.cls, d)
        elif not j.ended:
            _add(everyone, j.cls, max(0.0, horizon - j.submitted))
            for key in (j.cls, "all"):
                censored[key] = censored.get(key, 0) + 1
    return {"started": _summaries(started, None), "all": _summaries(everyone, censored)}


def completion_times(jobs: Iterable[JobTimes], horizon: float) -> dict[str, dict[str, Any]]:
    """``{"completed": {CLASS: {...}}, "all": {CLASS: {..., censored}}}`` (no serving class)."""
    done: dict[str, list[float]] = {"all": []}
    everyone: dict[str, list[float]] = {"all": []}
    censored: dict[str, int] = {}
    for j in jobs:
        if j.cls in NO_JCT_CLASSES:
            continue
        if j.completed is not None:
            v = j.completed - j.submitted
            _add(done, j.cls, v)
            _add(everyone, j.cls, v)
        elif not j.ended:
            _add(everyone, j.cls, max(0.0, horizon - j.submitted))
            for key in (j.cls, "all"):
                censored[key] = censored.get(key, 0) + 1
    return {"completed": _summaries(done, None), "all": _summaries(everyone, censored)}
