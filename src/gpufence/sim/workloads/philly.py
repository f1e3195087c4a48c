"""Loaders for the Microsoft Philly trace (Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU
Clusters for DNN Training Workloads", USENIX ATC'19).

Source: github.com/msr-fiddle/philly-traces (``trace-data.tar.gz``, Git-LFS); data CC BY 4.0.

``load_philly_jobs`` reads ``cluster_job_log``: a JSON list (plain or gzip) of jobs::

    {"status": "Pass" | "Killed" | "Failed", "vc": "...", "jobid": "...", "user": "...",
     "submitted_time": "2017-10-03 02:43:38",
     "attempts": [{"start_time": "...", "end_time": "...",
                   "detail": [{"ip": "m1", "gpus": ["gpu0", "gpu1"]}, ...]}, ...]}

Fields used and assumptions:

* #GPUs = GPU ids in the FIRST attempt's ``detail``; #nodes = ``len(detail)`` (the official
  notebook's definition; a detail entry with no GPU ids is not counted as a node). A gang on
  n nodes with g GPUs each becomes ``replicas = n`` of ``GpuRequest.whole(g)``; when the nodes
  hold different numbers of GPUs the job becomes one 1-GPU replica per GPU (counted in
  ``stats.flagged["nonuniform"]``) -- the simulator then only keeps the total;
* submit = ``submitted_time``; duration = last attempt's ``end_time`` - first attempt's
  ``start_time`` (so retries and the gaps between them count as run time); times are naive
  ``YYYY-MM-DD HH:MM:SS`` strings (a trailing zone word such as ``PST`` is ignored; the trace
  does not mix zones) and are rebased so the earliest kept submit is 0;
* jobs that never started (no attempts, or a first ``start_time`` of ``null`` / ``""`` /
  ``"None"``), that have no end on the last attempt, no GPUs, no submit time or a non-positive
  duration are skipped and counted in ``stats.skipped``; ``status`` (Pass / Killed / Failed) is
  kept in no field but can filter (``statuses``);
* ``vc`` can become the queue name (``vc_as_queue``); every job is ``WorkloadClass.TRAINING``.

``philly_runtimes`` reads a ``philly_runtime_seconds.csv`` given by path (one column
``runtime``, seconds; 83,154 values, median 1,186 s; taken from the PAI v2020 analysis notebook,
derivation undocumented) and :func:`sample_runtimes` draws from it (bootstrap).
"""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from collections.abc import Collection
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from gpufence.model.job import GpuRequest, Job, WorkloadClass
from gpufence.sim.workloads.demand import LoadStats, parse_float, read_csv
from gpufence.sim.workloads.records import WorkItem

_MISSING = ("", "none", "null", "nan")
_EPOCH = datetime(1970, 1, 1)


def _time_s(value: Any, where: str) -> float | None:
    """Seconds of a Philly time string; None for a missing one; ValueError for garbage."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a time string or null, got {value!r}")
    text = value.strip()
    if text.lower() in _MISSING:
        return None
    parts = text.split()
    if len(parts) == 3 and parts[2].isalpha():  # "2017-10-03 02:43:38 PST"
        text = f"{parts[0]} {parts[1]}"
    try:
        stamp = datetime.strptime(text, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not a 'YYYY-MM-DD HH:MM:SS' time") from None
    return (stamp - _EPOCH).total_seconds()


def _load_json(path: str | Path) -> list[Any]:
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: column {e.colno}: invalid JSON: {e.msg}") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of jobs, got {type(data).__name__}")
    return data


def _gpus_per_node(detail: Any, where: str) -> list[int]:
    if not isinstance(detail, list):
        raise ValueError(f"{where}.detail: expected a list, got {detail!r}")
    counts: list[int] = []
    for k, node in enumerate(detail):
        gpus = node.get("gpus") if isinstance(node, dict) else None
        if not isinstance(gpus, list):
            raise ValueError(f"{where}.detail[{k}].gpus: expected a list of GPU ids")
        counts.append(len(gpus))
    return counts


class _Kept(NamedTuple):
    """What a kept job contributes: its times (trace seconds) and the GPUs on each node."""

    submit: float
    duration: float
    per_node: list[int]


def _require_job_fields(entry: Any, where: str) -> dict[str, Any]:
    """The job object, after checking the fields every job must carry (bad input is an error)."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected an object, got {type(entry).__name__}")
    missing = [k for k in ("jobid", "submitted_time", "attempts") if k not in entry]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    return entry


def _run_span(attempts: Any, where: str) -> tuple[float, float] | str:
    """(first start, last end) of a job's attempts, or the reason the job is skipped.

    Retries and the gaps between them count as run time, so the span runs from the first
    attempt's start to the last attempt's end.
    """
    if not isinstance(attempts, list):
        raise ValueError(f"{where}.attempts: expected a list")
    if not attempts or not isinstance(attempts[0], dict):
        return "never_started"
    start = _time_s(attempts[0].get("start_time"), f"{where}.attempts[0].start_time")
    if start is None:
        return "never_started"
    last = attempts[-1]
    if not isinstance(last, dict):
        raise ValueError(f"{where}.attempts[{len(attempts) - 1}]: expected an object")
    end = _time_s(last.get("end_time"), f"{where}.attempts[{len(attempts) - 1}].end_time")
    if end is None:
        return "unfinished"
    return start, end


def _kept_or_skip(entry: dict[str, Any], where: str) -> _Kept | str:
    """The job's times and GPUs, or the reason it is skipped (checked in the documented order)."""
    span = _run_span(entry["attempts"], where)
    if isinstance(span, str):
        return span
    start, end = span
    detail = entry["attempts"][0].get("detail", [])
    per_node = [g for g in _gpus_per_node(detail, f"{where}.attempts[0]") if g > 0]
    if not per_node:
        return "no_gpus"
    submit = _time_s(entry["submitted_time"], f"{where}.submitted_time")
    if submit is None:
        return "no_submit_time"
    duration = end - start
    if duration <= 0:
        return "nonpositive_duration"
    return _Kept(submit, duration, per_node)


def _gang_shape(per_node: list[int], st: LoadStats) -> tuple[int, GpuRequest]:
    """(replicas, request) of a gang: one replica per node, or 1-GPU replicas when uneven."""
    if len(set(per_node)) == 1:
        return len(per_node), GpuRequest.whole(per_node[0])
    st.flag("nonuniform")  # kept, flattened to 1-GPU replicas
    return sum(per_node), GpuRequest.whole(1)


def load_philly_jobs(
    cluster_job_log: str | Path,
    *,
    rebase: bool = True,
    statuses: Collection[str] | None = None,
    checkpointable: bool = False,
    with_estimates: bool = False,
    vc_as_queue: bool = False,
    queue: str = "",
    stats: LoadStats | None = None,
) -> list[WorkItem]:
    """Jobs of a Philly ``cluster_job_log`` as work items, ordered by submit time.

    Skip reasons in ``stats``: ``status``, ``never_started``, ``unfinished``, ``no_gpus``,
    ``no_submit_time``, ``nonpositive_duration``; ``stats.flagged["nonuniform"]`` counts kept jobs
    whose nodes hold different numbers of GPUs (flattened to 1-GPU replicas).
    """
    path = cluster_job_log
    st = stats if stats is not None else LoadStats()
    pending: list[tuple[float, str, GpuRequest, int, str, float]] = []
    seen: Counter[str] = Counter()
    for i, raw in enumerate(_load_json(path)):
        where = f"{path}: job [{i}]"
        st.rows += 1
        entry = _require_job_fields(raw, where)
        if statuses is not None and entry.get("status") not in statuses:
            st.skip("status")
            continue
        kept = _kept_or_skip(entry, where)
        if isinstance(kept, str):
            st.skip(kept)
            continue
        replicas, request = _gang_shape(kept.per_node, st)
        # a job id the trace repeats gets a suffix, so every simulated job id is unique
        base_id = f"philly-{entry['jobid']}"
        seen[base_id] += 1
        job_id = base_id if seen[base_id] == 1 else f"{base_id}#{seen[base_id]}"
        vc = entry.get("vc")
        job_queue = str(vc) if vc_as_queue and vc else queue
        pending.append((kept.submit, job_id, request, replicas, job_queue, kept.duration))
    origin = min((p[0] for p in pending), default=0.0) if rebase else 0.0
    pending.sort(key=lambda p: (p[0], p[1]))
    items = [
        WorkItem(
            Job(
                id=job_id,
                workload_class=WorkloadClass.TRAINING,
                request=request,
                replicas=replicas,
                queue=job_queue,
                checkpointable=checkpointable,
                est_runtime_s=duration if with_estimates else None,
                submit_time=submit - origin,
            ),
            duration,
        )
        for submit, job_id, request, replicas, job_queue, duration in pending
    ]
    st.kept += len(items)
    return items


def philly_runtimes(path: str | Path) -> npt.NDArray[np.float64]:
    """The ``runtime`` column (seconds) of ``philly_runtime_seconds.csv``, in file order."""
    values: list[float] = []
    for line, row in read_csv(path, ("runtime",)):
        v = parse_float(path, line, row, "runtime")
        if v < 0:
            raise ValueError(f"{path}:{line}: column runtime: negative {v}")
        values.append(v)
    if not values:
        raise ValueError(f"{path}: no runtimes")
    return np.array(values, dtype=np.float64)


def sample_runtimes(
    rng: np.random.Generator,
    n: int,
    runtimes: npt.NDArray[np.float64],
    *,
    floor_s: float = 1.0,
) -> npt.NDArray[np.float64]:
    """Draw ``n`` runtimes (s) with replacement from ``runtimes``, at least ``floor_s`` each.

    The empirical Philly distribution contains zeros (jobs that died at once); a simulated job
    needs a positive duration, hence the floor.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if runtimes.size == 0:
        raise ValueError("runtimes is empty")
    if not (math.isfinite(floor_s) and floor_s >= 0):
        raise ValueError(f"floor_s must be finite and >= 0, got {floor_s}")
    drawn = rng.choice(runtimes, size=n, replace=True)
    return np.maximum(drawn.astype(np.float64), floor_s)
