"""telemetry.histograms (the live p99 and requests over an SLO) and the live link measures of
telemetry.interconnect, on hand-made data with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufence.telemetry import histograms as hist
from gpufence.telemetry.interconnect import (
    counter_rate,
    duplex_utilization,
    link_utilization,
    nvlink_utilization,
    pcie_bytes_per_s,
)
from gpufence.telemetry.measures import MEASURES


def test_quantile_interpolates_inside_the_bucket_as_prometheus_does() -> None:
    h = ((0.1, 0.2, 0.4), (50.0, 30.0, 20.0, 0.0))  # 100 requests
    assert hist.quantile(0.5, h) == pytest.approx(0.1)  # 50th request: the top of bucket 1
    assert hist.quantile(0.65, h) == pytest.approx(0.15)  # half-way into (0.1, 0.2]
    assert hist.quantile(0.99, h) == pytest.approx(0.2 + 0.2 * 19 / 20)
    assert hist.quantile(0.99, ((0.1,), (0.0, 0.0))) is None  # no requests
    assert hist.quantile(0.99, ((0.1, 0.2), (1.0, 0.0, 9.0))) == 0.2  # +Inf: the highest bound


def test_cumulative_buckets_requests_over_the_slo_and_rebinning() -> None:
    h = hist.from_cumulative([0.1, 0.2, math.inf], [60.0, 90.0, 100.0])
    assert h == ((0.1, 0.2), (60.0, 30.0, 10.0))
    assert hist.over(h, 0.15) == pytest.approx(15.0 + 10.0)  # half of (0.1, 0.2], all of +Inf
    assert hist.over(h, 0.0) == pytest.approx(100.0)
    onto = (0.05, 0.1, 0.15, 0.2, 0.3)
    r = hist.rebin(h, onto)
    assert r[1] == pytest.approx((30.0, 30.0, 15.0, 15.0, 0.0, 10.0))
    assert hist.requests(r) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="go down"):
        hist.from_cumulative([0.1, math.inf], [5.0, 4.0])
    with pytest.raises(ValueError, match=r"\+Inf"):
        hist.from_cumulative([0.1, 0.2], [1.0, 2.0])
    with pytest.raises(ValueError, match="ascending"):
        hist.check((0.2, 0.1), (1.0, 1.0, 1.0))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.floats(min_value=1e-3, max_value=30.0, allow_nan=False), min_size=200, max_size=2000
    )
)
def test_a_pushed_p99_is_within_ten_percent_of_the_exact_one(latencies: list[float]) -> None:
    """PUSH_BOUNDS grow 10 % a bucket: the interpolated p99 lands in the exact value's bucket."""
    exact = float(np.percentile(latencies, 99, method="inverted_cdf"))
    got = hist.quantile(0.99, hist.binned(latencies))
    assert got is not None
    assert exact / 1.1 <= got <= exact * 1.1


def test_link_measures() -> None:
    # an H100's 7200 Gbit/s of NVLink (both directions): 450 GB/s out and in is full
    assert nvlink_utilization(225e9, 225e9, 7200) == pytest.approx(0.5)
    assert nvlink_utilization(1e9, 1e9, 0) is None  # a PCIe-only GPU
    assert pcie_bytes_per_s(5, 16) == pytest.approx(32e9 * 128 / 130 / 8 * 16)  # ~63 GB/s
    assert pcie_bytes_per_s(9, 16) is None
    assert duplex_utilization(30.0, 10.0, 100.0) == pytest.approx(0.3)  # the busier direction
    assert link_utilization(5.0, None) is None  # loopback: no line rate
    assert link_utilization(500.0, 100.0) == 1.0  # clipped
    assert counter_rate(None, (1.0, 5.0)) is None
    assert counter_rate((1.0, 5.0), (3.0, 25.0)) == pytest.approx(10.0)
    assert counter_rate((1.0, 5.0), (3.0, 2.0)) is None  # reset
    assert counter_rate((1.0, 5.0), (1.0, 9.0)) is None  # the clock did not move


def test_every_measure_is_defined_once_in_base_units() -> None:
    units = ("_seconds", "_bytes", "_ratio", "_gpus", "_total", "_per_second", "_info")
    for name, m in MEASURES.items():
        assert name.startswith("gpufence_") and name == m.name
        assert (m.kind == "counter") == name.endswith("_total"), name
        assert len(m.help) > 8 and m.help == m.help.strip() and not m.help.endswith("."), name
        assert "job" not in m.labels and "instance" not in m.labels, name  # Prometheus' own
        if not name.endswith(units):
            assert m.kind == "gauge", name  # counts, utilisations and flags are plain gauges
