"""What the jobs themselves saw: start/end lines from their logs (``demo.programs`` format).

Oversubscription, hand-off gaps and makespan in the demo and the hand-off benchmark come from
here, so they check the scheduler against the processes' own clocks rather than its beliefs.
A job killed by SIGKILL writes no end line; its interval is closed by the attempt's exit record
(``rank-N.exit``, written by the launcher) when there is one.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from gpufence.control.base.member_records import RECORDS_SUFFIX, exit_file


@dataclass(frozen=True, slots=True)
class Run:
    job: str
    attempt: int
    rank: int
    device: str  # one CUDA_VISIBLE_DEVICES entry (a process holding 2 GPUs gives 2 runs)
    node: str
    start: float
    end: float


def _lines(path: Path) -> list[dict[str, object]]:
    out = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def _exit_time(path: Path) -> float | None:
    try:
        return float(json.loads(path.read_text(encoding="utf-8"))["ended_unix"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def runs(data_dir: Path, node: str = "local") -> list[Run]:
    """Every (attempt, rank, device) interval found under ``DATA/jobs``."""
    out: list[Run] = []
    for out_file in sorted((data_dir / "jobs").glob("*/attempt-*/rank-*.out")):
        lines = _lines(out_file)
        start = next((x for x in lines if x.get("ev") == "start"), None)
        if start is None:
            continue
        end = next((x for x in lines if x.get("ev") == "end"), None)
        t_end = float(end["t"]) if end is not None else None  # type: ignore[arg-type]
        if t_end is None:
            rank = int(out_file.stem.removeprefix("rank-"))
            t_end = _exit_time(exit_file(out_file.parent, rank))
        if t_end is None:
            continue
        devices = str(start.get("devices", ""))
        for dev in devices.split(",") if devices else []:
            out.append(
                Run(
                    job=str(start.get("job", "")),
                    attempt=int(start.get("attempt", 0)),  # type: ignore[call-overload]
                    rank=int(start.get("rank", 0)),  # type: ignore[call-overload]
                    device=dev,
                    node=node,
                    start=float(start["t"]),  # type: ignore[arg-type]
                    end=t_end,
                )
            )
    return out


def process_runs(data_dir: Path, node: str = "local") -> list[Run]:
    """Every (attempt, rank, device) interval from the launcher's records: from the moment the
    command was exec'd (``rank-N.started``) to the moment it was reaped (``rank-N.exit``). This
    is the process's whole life on the GPU, start-up included, observed by its parent."""
    out: list[Run] = []
    for started in sorted((data_dir / "jobs").glob(f"*/attempt-*{RECORDS_SUFFIX}/rank-*.started")):
        try:
            rec = json.loads(started.read_text(encoding="utf-8"))
            t0 = float(rec["exec_unix"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        t1 = _exit_time(started.with_suffix(".exit"))
        if t1 is None:
            continue
        records = started.parent  # DATA/jobs/<job>/attempt-N.records
        job = records.parent.name
        attempt = int(records.name.removesuffix(RECORDS_SUFFIX).removeprefix("attempt-"))
        rank = int(started.stem.removeprefix("rank-"))
        devices = str(rec.get("devices", ""))
        for dev in devices.split(",") if devices else []:
            out.append(Run(job, attempt, rank, dev, node, t0, t1))
    return out


def max_per_device(rs: list[Run]) -> int:
    """The most processes that held one device at the same instant (1 = never shared)."""
    worst = 0
    by_dev: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for r in rs:
        by_dev[(r.node, r.device)] += [(r.start, 1), (r.end, -1)]
    for points in by_dev.values():
        live = 0
        for _t, d in sorted(points, key=lambda p: (p[0], p[1])):  # ends before starts at ties
            live += d
            worst = max(worst, live)
    return worst


def handoff_gaps(rs: list[Run]) -> list[float]:
    """Seconds each device sat idle between one job's end and the next job's start on it."""
    by_dev: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for r in rs:
        by_dev[(r.node, r.device)].append(r)
    gaps = []
    for items in by_dev.values():
        items.sort(key=lambda r: r.start)
        gaps += [max(0.0, b.start - a.end) for a, b in itertools.pairwise(items)]
    return gaps


def makespan(rs: list[Run]) -> float:
    return max(r.end for r in rs) - min(r.start for r in rs) if rs else 0.0


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)
