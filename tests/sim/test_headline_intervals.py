"""Issue 33, item 11: intervals over seeds stay inside a figure's range, and policies run on
the same seeds are compared by paired differences."""

from __future__ import annotations

import math
import statistics

import pytest

from gpufence.sim.headline import headline_intervals, interval_dict, paired_differences
from gpufence.telemetry.distribution import t95


def _run(att: float, p99: float, preempted: int) -> dict[str, object]:
    return {
        "serving": {"slo_attainment": att, "p99_ms": p99},
        "preemptions": {"count": preempted},
    }


def test_intervals_are_cut_to_the_figures_range() -> None:
    """Attainments 1.0, 1.0, 0.2: the t-interval reaches below 0 and above 1."""
    runs = [_run(1.0, 80.0, 0), _run(1.0, 90.0, 3), _run(0.2, 100.0, 0)]
    got = headline_intervals({"single-queue": runs})["single-queue"]
    att = got["serving.slo_attainment"]
    assert att["mean"] == pytest.approx(0.7333, abs=1e-4)
    assert (att["ci95_low"], att["ci95_high"]) == (0.0, 1.0)
    pre = got["preemptions.count"]  # counts: never below 0
    assert pre["ci95_low"] == 0.0 and pre["ci95_high"] == pytest.approx(
        1 + t95(2) * math.sqrt(3) / math.sqrt(3)
    )
    p99 = got["serving.p99_ms"]  # inside its range: untouched
    assert p99["ci95_low"] == pytest.approx(90.0 - t95(2) * 10.0 / math.sqrt(3), abs=1e-4)


def test_an_interval_with_no_room_to_cut_is_unchanged() -> None:
    assert interval_dict([0.5, 0.6, 0.7], 0.0, 1.0) == interval_dict([0.5, 0.6, 0.7])


def test_policies_are_compared_seed_by_seed() -> None:
    """The seeds differ far more than the policies do: unpaired intervals overlap, the paired
    difference does not contain 0."""
    base = [_run(0.90, 100.0, 0), _run(0.50, 300.0, 0), _run(0.70, 200.0, 0)]
    fenced = [_run(0.95, 90.0, 1), _run(0.55, 280.0, 2), _run(0.76, 185.0, 1)]
    iv = headline_intervals({"single-queue": base, "fenced": fenced})
    a, b = iv["single-queue"]["serving.slo_attainment"], iv["fenced"]["serving.slo_attainment"]
    assert a["ci95_high"] > b["ci95_low"]  # overlapping
    got = paired_differences({"single-queue": base, "fenced": fenced})
    assert list(got) == ["fenced"]
    d = got["fenced"]["serving.slo_attainment"]
    diffs = [0.05, 0.05, 0.06]
    half = t95(2) * statistics.stdev(diffs) / math.sqrt(3)
    assert d["mean"] == pytest.approx(statistics.mean(diffs), abs=1e-4)
    assert d["ci95_low"] == pytest.approx(statistics.mean(diffs) - half, abs=1e-4)
    assert d["ci95_low"] > 0 and d["n"] == 3
    p99 = got["fenced"]["serving.p99_ms"]  # differences are not cut at 0
    assert p99["mean"] == pytest.approx(-15.0) and p99["ci95_high"] < 0


def test_an_overloaded_seed_leaves_the_difference_out() -> None:
    base = [_run(0.9, 100.0, 0), {"serving": {"slo_attainment": 0.1, "p99_ms": None}}]
    other = [_run(0.95, 90.0, 1), _run(0.9, 95.0, 0)]
    got = paired_differences({"a": base, "b": other})["b"]
    assert "serving.p99_ms" not in got and "serving.slo_attainment" in got
