"""The demo's joint-view rows: serving p99 against its SLO and the interconnect figures, read
from the control plane's own series (``GET /v1/series``'s data) at the end of an act.

What is measured and what is modelled is said on each row: serving latencies are the replicas'
own (a real request loop over loopback), the NIC and disk figures are the kernel's counters,
the NVLink / PCIe / GPU figures on fake GPUs are the demo's model (``gpu_model.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufence.control.base.config import ADMIN
from gpufence.control.observe.series_model import LinkSeries, SeriesResponse
from gpufence.control.plane import ControlPlane


def _peak(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return max(vals) if vals else None


def _rate(bytes_s: float | None) -> str:
    if bytes_s is None:
        return "-"
    for unit, div in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_s >= div:
            return f"{bytes_s / div:.1f} {unit}"
    return f"{bytes_s:.0f} B/s"


def _links(series: SeriesResponse, cls: str) -> list[LinkSeries]:
    return [lk for lk in series.links if lk.link_class == cls]


def serving_rows(series: SeriesResponse) -> list[tuple[str, str]]:
    rows = []
    for s in series.serving:
        worst = _peak(s.p99_ms)
        now = next((p for p in reversed(s.p99_ms) if p is not None), None)
        peak_rate = _peak(s.request_rate)
        most = _peak(float(r) for r in s.replicas if r is not None)
        slo = f"{s.slo_p99_ms:g} ms" if s.slo_p99_ms is not None else "none"
        att = f"{s.slo_attainment:.1%}" if s.slo_attainment is not None else "-"
        p99 = (
            f"{now:.1f} ms at the end, worst {worst:.1f} ms"
            if now is not None and worst is not None
            else "no requests measured"
        )
        rows.append(
            (
                f"serving {s.deployment}: p99 vs SLO",
                f"{p99} vs SLO {slo}; attainment {att} (measured by the replicas' own request "
                f"loops, up to {peak_rate or 0:.0f} req/s on {most or 0:.0f} replicas)",
            )
        )
    return rows


ATTAINMENT_GOAL = 0.9
"""The demo's serving objective: at least this share of requests served in windows whose p99
met the SLO (``gpufence_serving_slo_attainment``). Below it, the act's verdict fails."""


def serving_misses(series: SeriesResponse, goal: float = ATTAINMENT_GOAL) -> list[str]:
    """What missed the serving SLO the act prints (empty: every deployment met it): a
    deployment with an SLO whose attainment is under ``goal`` or was never measured."""
    out = []
    for s in series.serving:
        if s.slo_p99_ms is None:
            continue
        worst = _peak(s.p99_ms)
        if s.slo_attainment is None or worst is None:
            out.append(f"serving {s.deployment}: no latency measured against its SLO")
        elif s.slo_attainment < goal:
            out.append(
                f"serving {s.deployment} missed its SLO: attainment {s.slo_attainment:.1%} < "
                f"{goal:.0%} goal (worst p99 {worst:.1f} ms vs SLO {s.slo_p99_ms:g} ms)"
            )
    return out


def interconnect_rows(series: SeriesResponse, fake: bool) -> list[tuple[str, str]]:
    rows = []
    nics = _links(series, "nic")
    if nics:
        busiest = max(nics, key=lambda lk: _peak(lk.bytes_per_s) or 0.0)
        rows.append(
            (
                f"NIC {busiest.link}: peak throughput",
                f"{_rate(_peak(busiest.bytes_per_s))} (measured: /sys/class/net; the replicas' "
                "requests travel over loopback)",
            )
        )
    how = "modelled: fake GPUs" if fake else "measured: NVML"
    for cls in ("nvlink", "pcie"):
        links = _links(series, cls)
        peaks = [(lk, _peak(lk.utilization)) for lk in links]
        busy = [(lk, u) for lk, u in peaks if u]
        if busy:
            top = max(u for _, u in busy)
            on = ", ".join(lk.link.removeprefix("gpu") for lk, _ in busy)
            rows.append((f"{cls} utilisation: peak", f"{top:.0%} on GPUs {on} ({how})"))
        elif links:
            rows.append((f"{cls} utilisation: peak", f"0% ({how})"))
    for st in series.storage:
        rows.append(
            (
                f"storage {st.device} (the data dir): worst await",
                f"{(_peak(st.await_s) or 0.0) * 1000:.2f} ms, busy up to "
                f"{_peak(st.busy) or 0.0:.0%} (measured: /proc/diskstats)",
            )
        )
    return rows


def joint_rows(plane: ControlPlane, since: float) -> list[tuple[str, str]]:
    """The rows for an act's table, from ``since`` to now at the plane's own step."""
    series = plane.series(ADMIN, since, None, plane.config.telemetry.series_step_s)
    return serving_rows(series) + interconnect_rows(series, plane.discovery.fake)


def slo_misses(plane: ControlPlane, since: float) -> list[str]:
    """``serving_misses`` of the series ``joint_rows`` printed (from ``since`` to now)."""
    return serving_misses(plane.series(ADMIN, since, None, plane.config.telemetry.series_step_s))
