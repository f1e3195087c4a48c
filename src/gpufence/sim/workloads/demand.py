"""Serving demand curves returned by the serving-trace loaders, plus reading helpers they share.

* :class:`RequestDemand`: a request-rate curve (requests/s per fixed-width bin) with the first two
  moments of the per-request service time, the input of the M/G/c-style serving model.
* :class:`ReplicaDemand`: a replica-count step curve (replicas alive from each time on), the
  input when the trace gives replicas rather than requests (Alibaba v2025 DLRM).
* :class:`LoadStats`: what a job-trace loader read, kept and skipped (and why).

The helpers at the end (:func:`open_trace`, :func:`read_csv`, :func:`parse_float`, ...) open plain
or gzip files and turn every bad row into a ``ValueError`` naming file, line and column.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def _frozen_array(values: npt.ArrayLike, dtype: type[np.generic]) -> npt.NDArray[np.generic]:
    arr = np.array(values, dtype=dtype, copy=True)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class RequestDemand:
    """Request arrivals as a piecewise-constant rate: ``rate[i]`` req/s in bin ``i``.

    Bin ``i`` is ``[i * bin_s, (i + 1) * bin_s)``. ``service_s_mean`` and ``service_s_cv``
    describe the per-request service time (mean and coefficient of variation std/mean) on one
    serving slot of one replica. Time 0 is the start of the trace (its first request); past the
    last bin the rate is 0.
    """

    name: str
    bin_s: float
    rate: FloatArray
    service_s_mean: float
    service_s_cv: float
    source: str = ""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bin_s) and self.bin_s > 0):
            raise ValueError(f"{self.name}: bin_s must be positive, got {self.bin_s}")
        rate = _frozen_array(self.rate, np.float64)
        if rate.ndim != 1:
            raise ValueError(f"{self.name}: rate must be one-dimensional")
        if rate.size and (not np.all(np.isfinite(rate)) or float(rate.min()) < 0):
            raise ValueError(f"{self.name}: rate must be finite and non-negative")
        for label, v in (
            ("service_s_mean", self.service_s_mean),
            ("service_s_cv", self.service_s_cv),
        ):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{self.name}: {label} must be finite and >= 0, got {v}")
        object.__setattr__(self, "rate", rate)

    @staticmethod
    def from_arrivals(
        name: str,
        arrivals_s: npt.ArrayLike,
        service_s: npt.ArrayLike,
        bin_s: float,
        source: str = "",
    ) -> RequestDemand:
        """Bin arrival times (any origin; shifted so the first is 0) into a rate curve.

        ``service_s`` holds the service times the moments are taken from (it may be shorter than
        the arrivals when some requests have none recorded).
        """
        if not (math.isfinite(bin_s) and bin_s > 0):
            raise ValueError(f"{name}: bin_s must be positive, got {bin_s}")
        t = np.asarray(arrivals_s, dtype=np.float64)
        if t.size == 0:
            rate: FloatArray = np.zeros(0, dtype=np.float64)
        else:
            rel = t - float(t.min())
            counts = np.bincount(np.floor(rel / bin_s).astype(np.int64))
            rate = counts.astype(np.float64) / bin_s
        s = np.asarray(service_s, dtype=np.float64)
        mean = float(s.mean()) if s.size else 0.0
        cv = float(s.std()) / mean if s.size and mean > 0 else 0.0
        return RequestDemand(name, float(bin_s), rate, mean, cv, source)

    @property
    def duration_s(self) -> float:
        return float(self.rate.size) * self.bin_s

    def total_requests(self) -> float:
        return float(self.rate.sum()) * self.bin_s

    def peak_rate(self) -> float:
        return float(self.rate.max()) if self.rate.size else 0.0

    def mean_rate(self) -> float:
        return float(self.rate.mean()) if self.rate.size else 0.0

    def at(self, t: float) -> float:
        """Rate (req/s) at time ``t``: the bin holding ``t``; 0 before 0 and past the end."""
        if not t >= 0:  # also rejects NaN
            return 0.0
        i = int(t // self.bin_s)
        return float(self.rate[i]) if i < self.rate.size else 0.0

    def scaled(self, factor: float) -> RequestDemand:
        """The same curve with every rate multiplied by ``factor`` (service time unchanged)."""
        if not (math.isfinite(factor) and factor >= 0):
            raise ValueError(f"{self.name}: scale factor must be finite and >= 0, got {factor}")
        return RequestDemand(
            self.name,
            self.bin_s,
            self.rate * factor,
            self.service_s_mean,
            self.service_s_cv,
            self.source,
        )

    def resampled(self, bin_s: float) -> RequestDemand:
        """Re-bin to width ``bin_s``, keeping the number of requests in every time interval.

        The cumulative request count is interpolated linearly inside old bins; the last new bin
        is padded with zero rate past the old end, so the total number of requests is unchanged.
        """
        if not (math.isfinite(bin_s) and bin_s > 0):
            raise ValueError(f"{self.name}: bin_s must be positive, got {bin_s}")
        n_new = math.ceil(self.duration_s / bin_s - 1e-9) if self.rate.size else 0
        old_edges = np.arange(self.rate.size + 1, dtype=np.float64) * self.bin_s
        cum = np.concatenate(([0.0], np.cumsum(self.rate * self.bin_s)))
        new_edges = np.arange(n_new + 1, dtype=np.float64) * bin_s
        cum_new = np.interp(new_edges, old_edges, cum) if self.rate.size else np.zeros(1)
        rate = np.diff(cum_new) / bin_s
        return RequestDemand(
            self.name,
            float(bin_s),
            np.maximum(rate, 0.0),
            self.service_s_mean,
            self.service_s_cv,
            self.source,
        )


@dataclass(frozen=True, eq=False)
class ReplicaDemand:
    """Replicas wanted over time: ``replicas[i]`` from ``times[i]`` (s) until ``times[i+1]``.

    Before ``times[0]`` the demand is 0; after the last time it stays at ``replicas[-1]``.
    """

    name: str
    times: FloatArray
    replicas: IntArray
    gpus_per_replica: int
    source: str = ""

    def __post_init__(self) -> None:
        times = _frozen_array(self.times, np.float64)
        reps = _frozen_array(self.replicas, np.int64)
        if times.ndim != 1 or reps.shape != times.shape:
            raise ValueError(f"{self.name}: times and replicas must be 1-D of equal length")
        if times.size and not np.all(np.isfinite(times)):
            raise ValueError(f"{self.name}: times must be finite")
        if times.size > 1 and not np.all(np.diff(times) > 0):
            raise ValueError(f"{self.name}: times must be strictly increasing")
        if reps.size and int(reps.min()) < 0:
            raise ValueError(f"{self.name}: replica counts must be >= 0")
        if self.gpus_per_replica < 1:
            raise ValueError(f"{self.name}: gpus_per_replica must be >= 1")
        object.__setattr__(self, "times", times)
        object.__setattr__(self, "replicas", reps)

    @staticmethod
    def from_intervals(
        name: str,
        starts: npt.ArrayLike,
        ends: npt.ArrayLike,
        gpus_per_replica: int,
        source: str = "",
    ) -> ReplicaDemand:
        """Replica lifetimes ``[start, end)`` (``end`` may be ``inf``) as a step curve.

        When every replica starts after 0 the curve gets a leading ``(0, 0)`` step.
        """
        s = np.asarray(starts, dtype=np.float64)
        e = np.asarray(ends, dtype=np.float64)
        if s.shape != e.shape or s.ndim != 1:
            raise ValueError(f"{name}: starts and ends must be 1-D of equal length")
        if np.any(e < s):
            raise ValueError(f"{name}: a replica ends before it starts")
        finite_e = e[np.isfinite(e)]
        stamps = np.concatenate((s, finite_e))
        deltas = np.concatenate((np.ones(s.size, np.int64), -np.ones(finite_e.size, np.int64)))
        times, inverse = np.unique(stamps, return_inverse=True)
        step = np.zeros(times.size, dtype=np.int64)
        np.add.at(step, inverse, deltas)
        counts = np.cumsum(step)
        if times.size == 0 or times[0] > 0:
            times = np.concatenate(([0.0], times))
            counts = np.concatenate(([0], counts))
        return ReplicaDemand(name, times, counts, gpus_per_replica, source)

    @staticmethod
    def combined(demands: Sequence[ReplicaDemand], name: str) -> ReplicaDemand:
        """The sum of several curves (they must share ``gpus_per_replica``)."""
        if not demands:
            raise ValueError(f"{name}: nothing to combine")
        gpr = {d.gpus_per_replica for d in demands}
        if len(gpr) != 1:
            raise ValueError(f"{name}: cannot combine different gpus_per_replica {sorted(gpr)}")
        times = np.unique(np.concatenate([d.times for d in demands]))
        total = np.zeros(times.size, dtype=np.int64)
        for d in demands:
            idx = np.searchsorted(d.times, times, side="right") - 1
            total += np.where(idx >= 0, d.replicas[np.maximum(idx, 0)], 0)
        sources = sorted({d.source for d in demands})
        return ReplicaDemand(name, times, total, gpr.pop(), "; ".join(sources))

    def peak(self) -> int:
        return int(self.replicas.max()) if self.replicas.size else 0

    def peak_gpus(self) -> int:
        return self.peak() * self.gpus_per_replica

    def at(self, t: float) -> int:
        """Replicas wanted at time ``t`` (0 before the first step)."""
        if math.isnan(t):
            return 0
        i = int(np.searchsorted(self.times, t, side="right")) - 1
        return int(self.replicas[i]) if i >= 0 else 0


@dataclass
class LoadStats:
    """What a loader saw: rows read, items kept, rows skipped per reason, kept rows flagged."""

    rows: int = 0
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    flagged: dict[str, int] = field(default_factory=dict)  # kept, but altered (reason)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def flag(self, reason: str) -> None:
        self.flagged[reason] = self.flagged.get(reason, 0) + 1


# --- reading helpers shared by the loaders -----------------------------------------------------


def open_trace(path: str | Path) -> IO[str]:
    """Open a text trace, gunzipping it when it is gzip (by content, not by name)."""
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def read_csv(
    path: str | Path,
    required: Iterable[str],
    names: Sequence[str] | None = None,
) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield ``(line, row)`` for a CSV trace; ``row`` maps column name to the stripped cell.

    With ``names`` the file may have no header (the columns are ``names`` in order) or a header
    line holding all of ``names``. Without ``names`` the first line is the header. A missing
    column or a row with the wrong number of cells raises ``ValueError`` naming file and line.
    """
    need = list(required)
    with open_trace(path) as f:
        reader = csv.reader(f)
        first = next(reader, None)
        if first is None:
            raise ValueError(f"{path}:1: empty file (need columns {', '.join(need)})")
        cells = [c.strip() for c in first]
        pending: list[str] | None = None
        if names is not None and not set(names) <= set(cells):
            header, pending = list(names), cells
        else:
            header = cells
        missing = [c for c in need if c not in header]
        if missing:
            raise ValueError(
                f"{path}:1: missing column(s) {', '.join(missing)} (header: {', '.join(header)})"
            )
        width = len(header)

        def check(line: int, row: list[str]) -> dict[str, str]:
            if len(row) != width:
                raise ValueError(f"{path}:{line}: expected {width} columns, found {len(row)}")
            return {k: v.strip() for k, v in zip(header, row, strict=True)}

        if pending is not None:
            yield 1, check(1, pending)
        for row in reader:
            if not row:  # blank line
                continue
            yield reader.line_num, check(reader.line_num, row)


def parse_float(
    path: str | Path, line: int, row: dict[str, str], column: str, empty: float | None = None
) -> float:
    """A finite number from ``row[column]``; ``empty`` (if given) stands for an empty cell."""
    text = row[column]
    if text == "" and empty is not None:
        return empty
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{path}:{line}: column {column}: {text!r} is not a finite number")
    return value


def parse_count(path: str | Path, line: int, row: dict[str, str], column: str) -> int:
    """A non-negative integer from ``row[column]`` (``"2.0"`` is accepted)."""
    value = parse_float(path, line, row, column)
    if value < 0 or value != int(value):
        raise ValueError(f"{path}:{line}: column {column}: {row[column]!r} is not a count")
    return int(value)


_EPOCH = datetime(1970, 1, 1)


def parse_datetime_s(path: str | Path, line: int, row: dict[str, str], column: str) -> float:
    """Seconds since 1970 of a naive ``YYYY-MM-DD HH:MM:SS[.fraction]`` cell (no time zone)."""
    text = row[column]
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{path}:{line}: column {column}: {text!r} is not a 'YYYY-MM-DD HH:MM:SS' time"
        ) from None
    return (stamp.replace(tzinfo=None) - _EPOCH).total_seconds()
