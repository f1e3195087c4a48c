"""Interconnect utilisation: per link, the share of its bandwidth that gang traffic uses.

Links come in classes: ``nvlink`` (a node's GPU-to-GPU fabric, averaged over its GPUs),
``node_uplink`` (a node's NICs to its rack switch) and ``rack_uplink`` (a rack to the spine).
A link's utilisation at a moment is its carried traffic / its bandwidth (0..1), time-averaged
over the all-reduce phases of the gangs on it (``sim/fabric.py`` computes it).

The summary of a class pools every link of the class at every sample — the distribution of
"a link of this class at a random moment" — so an idle link counts as 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

LINK_CLASSES = ("nvlink", "node_uplink", "rack_uplink")
LIVE_LINK_CLASSES = ("nvlink", "pcie", "nic")  # what the control plane measures per node


def link_class_summary(
    samples: Iterable[Mapping[str, float]],
    link_class: Mapping[str, str],
    links_per_class: Mapping[str, int],
) -> dict[str, dict[str, float]]:
    """``{class: {p50, p95, max, mean}}`` over (sample, link) pairs. ``samples`` hold the
    utilisation of the links that carried traffic (absent = 0)."""
    values: dict[str, list[float]] = {c: [] for c in links_per_class}
    n_samples = 0
    for s in samples:
        n_samples += 1
        for link, u in s.items():
            values.setdefault(link_class[link], []).append(min(max(u, 0.0), 1.0))
    out: dict[str, dict[str, float]] = {}
    for cls, vals in values.items():
        total = n_samples * links_per_class.get(cls, 0)
        if total <= 0:
            continue
        arr = np.zeros(max(total, len(vals)))
        arr[: len(vals)] = vals
        out[cls] = {
            "p50": round(float(np.percentile(arr, 50)), 4),
            "p95": round(float(np.percentile(arr, 95)), 4),
            "max": round(float(arr.max()), 4),
            "mean": round(float(arr.mean()), 4),
        }
    return out


# -- the live links (control plane): one measured link's utilisation --------------------------
# A link's utilisation is its carried traffic over its bandwidth, as above, from counters:
# NVLink from NVML (data bytes, both directions, over the GPU's aggregate NVLink bandwidth of
# the catalogue, which counts both directions: 900 GB/s on an H100), PCIe from NVML (each
# direction over the link's per-direction bandwidth: the busier direction is the link's load),
# a NIC from /sys/class/net (the busier direction over its line rate).

# PCIe payload bandwidth per lane and direction in bytes/s by generation, after line encoding
# (8b/10b for Gen 1-2, 128b/130b for Gen 3-5; Gen 6's FLIT mode taken as 242/256)
PCIE_LANE_BYTES_S = {
    1: 2.5e9 * 0.8 / 8,
    2: 5e9 * 0.8 / 8,
    3: 8e9 * 128 / 130 / 8,
    4: 16e9 * 128 / 130 / 8,
    5: 32e9 * 128 / 130 / 8,
    6: 64e9 * 242 / 256 / 8,
}


def pcie_bytes_per_s(generation: int, width: int) -> float | None:
    """Per-direction bandwidth of a PCIe link (None for an unknown generation)."""
    lane = PCIE_LANE_BYTES_S.get(generation)
    return lane * width if lane is not None and width > 0 else None


def link_utilization(bytes_per_s: float, capacity_bytes_per_s: float | None) -> float | None:
    """Carried / capacity, clipped to 0..1 (counters and line rates disagree a little); None
    where the capacity is unknown (a loopback device has no line rate)."""
    if capacity_bytes_per_s is None or capacity_bytes_per_s <= 0:
        return None
    return min(max(bytes_per_s / capacity_bytes_per_s, 0.0), 1.0)


def nvlink_utilization(tx_bytes_s: float, rx_bytes_s: float, nvlink_gbps: float) -> float | None:
    """A GPU's NVLink load: both directions over its aggregate bandwidth (Gbit/s, both ways)."""
    return link_utilization(tx_bytes_s + rx_bytes_s, nvlink_gbps * 1e9 / 8 if nvlink_gbps else None)


def duplex_utilization(
    tx_bytes_s: float, rx_bytes_s: float, capacity_bytes_per_s: float | None
) -> float | None:
    """A full-duplex link (PCIe, a NIC): the busier direction over the per-direction rate."""
    return link_utilization(max(tx_bytes_s, rx_bytes_s), capacity_bytes_per_s)


def counter_rate(prev: tuple[float, float] | None, now: tuple[float, float]) -> float | None:
    """Per-second rate of a monotonic counter between two (time, value) readings; None for the
    first reading, a clock that did not move, or a counter that went back (reset, wrap)."""
    if prev is None:
        return None
    dt = now[0] - prev[0]
    dv = now[1] - prev[1]
    if dt <= 0 or dv < 0:
        return None
    return dv / dt
