"""Self-contained HTML report of a simulation: plots embedded as base64 PNG, plus verdicts.

Plots per policy: serving p99 over time against the SLO, queue-delay CDFs per class, GPU
allocation and utilisation over time per partition, fragmentation over time, fabric utilisation
per rack over time, and a preemption / reclaim timeline.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display on servers or CI
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from gpufence.advice.present import html_section
from gpufence.model.decisions import Notice, Reason
from gpufence.sim.experiment import PolicyRun
from gpufence.sim.latency import INF
from gpufence.sim.report_text import dur as _dur

CLASSES = ("serving", "training", "interactive", "batch")


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _hours(ts: Sequence[float]) -> list[float]:
    return [t / 3600.0 for t in ts]


def plot_serving(run: PolicyRun) -> str:
    fig, ax = plt.subplots(figsize=(8, 3))
    for f in run.fleets:
        xs = _hours([w.end for w in f.windows])
        cap = f.svc.slo_p99_ms * 4
        ys = [min(w.p99_ms, cap) if w.p99_ms != INF else cap for w in f.windows]
        ax.plot(xs, ys, lw=1, label=f"{f.svc.name} p99")
        ax.axhline(f.svc.slo_p99_ms, color="red", ls="--", lw=1, label=f"{f.svc.name} SLO")
    ax.set_xlabel("hours")
    ax.set_ylabel("p99 ms (overload drawn at 4x SLO)")
    if run.fleets:
        ax.legend(fontsize=7)
    else:
        ax.text(
            0.5, 0.5, "no serving services in this workload", ha="center", transform=ax.transAxes
        )
    ax.set_title(f"{run.policy}: serving p99 over time")
    return _png(fig)


def plot_queue_cdf(run: PolicyRun) -> str:
    fig, ax = plt.subplots(figsize=(8, 3))
    per: dict[str, list[float]] = {c: [] for c in CLASSES}
    for tr in run.result.jobs.values():
        if tr.first_start is not None:
            per[str(tr.item.job.workload_class)].append((tr.first_start - tr.submitted) / 60.0)
    for cls, vals in per.items():
        if vals:
            vals.sort()
            ys = [(i + 1) / len(vals) for i in range(len(vals))]
            ax.plot([max(v, 1e-3) for v in vals], ys, label=f"{cls} (n={len(vals)})")
    ax.set_xscale("log")
    ax.set_xlabel("queue delay (minutes, log)")
    ax.set_ylabel("CDF")
    ax.legend(fontsize=7)
    ax.set_title(f"{run.policy}: queue delay per class")
    return _png(fig)


def plot_partitions(run: PolicyRun) -> str:
    s = run.timeline.samples
    fig, axes = plt.subplots(1, 2, figsize=(10, 3))
    xs = _hours([x.t for x in s])
    for p, gpus in run.cluster.partition_gpus.items():
        cap = max(len(gpus), 1)
        axes[0].plot(xs, [x.allocated.get(p, 0.0) / cap for x in s], label=f"{p} allocated")
        axes[0].plot(xs, [x.busy.get(p, 0.0) / cap for x in s], ls=":", label=f"{p} busy")
        axes[1].plot(xs, [x.fragmentation.get(p, 0.0) for x in s], label=p)
    axes[0].set_ylim(0, 1.05)
    axes[0].set_title("GPU allocation / utilisation per partition")
    axes[0].legend(fontsize=6)
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title("fragmentation (free GPUs on partly used nodes)")
    axes[1].legend(fontsize=6)
    for ax in axes:
        ax.set_xlabel("hours")
    return _png(fig)


def plot_fabric(run: PolicyRun) -> str:
    s = run.timeline.samples
    fig, ax = plt.subplots(figsize=(8, 3))
    xs = _hours([x.t for x in s])
    for rack in run.cluster.racks:
        ax.plot(xs, [x.rack_util.get(rack, 0.0) for x in s], label=rack)
    ax.plot(xs, [x.storage_util for x in s], color="black", ls=":", label="checkpoint storage")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("hours")
    ax.set_ylabel("uplink utilisation (bursts)")
    ax.set_title(f"{run.policy}: fabric utilisation per rack, checkpoint storage load")
    ax.legend(fontsize=7)
    return _png(fig)


def plot_incidents(run: PolicyRun) -> str:
    fig, ax = plt.subplots(figsize=(8, 2.2))
    rows = {
        Reason.INCIDENT_PREEMPTION: 3,
        Reason.ON_DEMAND_PREEMPTION: 3,
        Reason.LENT_RECLAIM: 2,
        Reason.IDLE: 1,
    }
    for reason, y in rows.items():
        ts = [t / 3600.0 for t, d in run.result.log if isinstance(d, Notice) and d.reason is reason]
        if ts:
            ax.scatter(ts, [y] * len(ts), s=12, label=f"{reason.value} ({len(ts)})")
    ax.set_yticks([1, 2, 3], ["idle reclaim", "lent reclaim", "preemption"])
    ax.set_xlabel("hours")
    ax.set_xlim(0, max(run.result.end_time, 1.0) / 3600.0)
    ax.set_title(f"{run.policy}: preemption / reclaim notices")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    return _png(fig)


def verdict(name: str, m: dict[str, Any]) -> str:
    """A plain-language verdict for one policy."""
    sv = m["serving"]
    att = sv["slo_attainment"]
    tq = m["queue_delay_s"].get("training", {})
    ok = "kept" if att >= 0.999 else "missed"
    p99 = sv["p99_ms"]
    p99s = "overloaded" if p99 is None else f"{p99:.0f} ms"
    parts = [
        f"Serving {ok} its p99 SLO ({sv['slo_ms']:.0f} ms) for {att:.2%} of requests "
        f"(worst window p99 {p99s}).",
    ]
    if tq:
        parts.append(f"Training waited p50 {_dur(tq['p50'])}, p99 {_dur(tq['p99'])} for its GPUs.")
    pre = m["preemptions"]
    if pre["count"]:
        parts.append(
            f"{pre['count']} preemptions cost {pre['gpu_hours_lost']:.1f} GPU-hours of work"
            f" ({', '.join(f'{k}: {v}' for k, v in pre['by_reason'].items())})."
        )
    else:
        parts.append("No preemptions.")
    rec = m["reclaims"]
    if rec["count"]:
        parts.append(f"{rec['count']} reclaims returned {rec['gpu_hours_returned']:.1f} GPU-hours.")
    parts.append(
        f"GPUs were {m['gpu']['allocation_ratio']:.0%} allocated and "
        f"{m['gpu']['utilization']:.0%} busy on average."
    )
    if m["invariant_violations"]:
        parts.append(f"WARNING: {m['invariant_violations']} invariant violations.")
    return " ".join(parts)


def render(title: str, runs: list[PolicyRun], metrics: dict[str, Any]) -> str:
    rows = []
    for run in runs:
        m = metrics["policies"][run.policy]
        q = m["queue_delay_s"].get("training", {"p50": math.nan, "p99": math.nan})
        rows.append(
            f"<tr><td>{html.escape(run.policy)}</td><td>{m['serving']['slo_attainment']:.4f}</td>"
            f"<td>{_dur(q['p50'])}</td><td>{_dur(q['p99'])}</td>"
            f"<td>{m['preemptions']['count']}</td><td>{m['reclaims']['count']}</td>"
            f"<td>{m['gpu']['allocation_ratio']:.3f}</td><td>{m['invariant_violations']}</td></tr>"
        )
    sections = []
    for run in runs:
        m = metrics["policies"][run.policy]
        imgs = [
            plot_serving(run),
            plot_queue_cdf(run),
            plot_partitions(run),
            plot_fabric(run),
            plot_incidents(run),
        ]
        body = "".join(f'<img src="{src}" alt="plot">' for src in imgs)
        body += html_section(m.get("advice", []), f"Advice for {run.policy}")  # gpufence.advice
        sections.append(
            f"<section><h2>{html.escape(run.policy)}</h2>"
            f"<p class=verdict>{html.escape(verdict(run.policy, m))}</p>{body}</section>"
        )
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>{html.escape(title)}</title><style>
body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px}}
img{{display:block;margin:8px 0;max-width:100%}}.verdict{{background:#f4f4f4;padding:8px}}
</style></head><body><h1>{html.escape(title)}</h1>
<table><tr><th>policy</th><th>serving SLO attainment</th><th>training wait p50</th>
<th>training wait p99</th><th>preemptions</th><th>reclaims</th><th>GPU allocation</th>
<th>invariant violations</th></tr>{"".join(rows)}</table>
{"".join(sections)}</body></html>"""
