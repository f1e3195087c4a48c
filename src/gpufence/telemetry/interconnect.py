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
