"""Self-contained HTML report of a simulation: plots embedded as base64 PNG, plus verdicts.

Per policy: a verdict in words, the joint view (``sim.report_joint``: serving load and p99,
queue delay per class, link utilisation and incident marks on one time axis), queue-delay
CDFs per class, and GPU allocation, utilisation and fragmentation per partition. With several
seeds, a table of every headline figure's mean and 95 % interval comes first (the plots are
the first seed's).
"""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display on servers or CI
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from gpufence.advice.present import html_section
from gpufence.sim.policy_run import PolicyRun
from gpufence.sim.report_joint import joint_figure
from gpufence.sim.report_text import dur as _dur

CLASSES = ("serving", "training", "interactive", "batch")


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def plot_queue_cdf(run: PolicyRun) -> str:
    per: dict[str, list[float]] = {c: [] for c in CLASSES}
    for tr in run.result.jobs.values():
        if tr.first_start is not None:
            per[str(tr.item.job.workload_class)].append((tr.first_start - tr.submitted) / 60.0)
    return _png(queue_cdf_figure(per, f"{run.policy}: queue delay per class"))


ZERO_FLOOR_MIN = 1e-3
"""Where a zero delay is drawn on the log axis (minutes; 0.06 s)."""
_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"))


def queue_cdf_figure(per: dict[str, list[float]], title: str) -> Figure:
    """Each class's CDF of queue delay (minutes). A delay of 0 cannot sit on a log axis, so it
    is drawn at ``ZERO_FLOOR_MIN``; classes that never waited all draw the same vertical line
    there, so each class gets its own line style and marker, its line is nudged along the
    axis (x1.3 per class, far below any real delay), and its label gives the share that
    waited 0 s -- else all but one of them vanished behind the last drawn (issue 32)."""
    fig, ax = plt.subplots(figsize=(8, 3))
    for k, (cls, vals) in enumerate(per.items()):
        if not vals:
            continue
        vals = sorted(vals)
        ys = [(i + 1) / len(vals) for i in range(len(vals))]
        floor = ZERO_FLOOR_MIN * 1.3**k
        zero = sum(v <= 0 for v in vals) / len(vals)
        line, marker = _STYLES[k % len(_STYLES)]
        ax.plot(
            [max(v, floor) for v in vals],
            ys,
            linestyle=line,
            marker=marker,
            markevery=[0, len(vals) - 1],
            label=f"{cls} (n={len(vals)} started, {zero:.0%} waited 0 s)",
        )
    ax.set_xscale("log")
    ax.set_xlabel("queue delay (minutes, log; 0 s drawn at the far left) of the jobs that started")
    ax.set_ylabel("CDF")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax.set_title(title)
    return fig


def plot_partitions(run: PolicyRun) -> str:
    s = run.timeline.samples
    fig, axes = plt.subplots(1, 2, figsize=(10, 3))
    xs = [x.t / 3600.0 for x in s]
    for p, gpus in run.cluster.partition_gpus.items():
        cap = max(len(gpus), 1)
        axes[0].plot(xs, [x.allocated.get(p, 0.0) / cap for x in s], label=f"{p} allocated")
        axes[0].plot(xs, [x.busy.get(p, 0.0) / cap for x in s], ls=":", label=f"{p} busy")
        axes[1].plot(xs, [x.fragmentation.get(p, 0.0) for x in s], label=p)
    axes[0].set_ylim(0, 1.05)
    axes[0].set_title("GPU allocation / utilisation per partition")
    axes[0].legend(fontsize=6)
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title("fragmentation (free capacity the largest unit cannot use)")
    axes[1].legend(fontsize=6)
    for ax in axes:
        ax.set_xlabel("hours")
    return _png(fig)


def plot_joint(run: PolicyRun) -> str:
    return _png(joint_figure(run))


def _pct(x: float) -> str:
    return f"{x:.2%}"


def verdict(name: str, m: dict[str, Any]) -> str:
    """A plain-language verdict for one policy (the numbers are ``metrics.json``'s)."""
    parts: list[str] = []
    sv = m["serving"]
    if sv.get("services"):
        att = sv["slo_attainment"]
        slo_ms = sv["slo_ms"]
        worst = sv.get("worst_window_p99_ms")
        worst_s = "no steady state (overloaded)" if worst is None else f"{worst:.0f} ms"
        p99 = sv["p99_ms"]
        p99_s = "unbounded (overloaded windows)" if p99 is None else f"{p99:.0f} ms"
        if att >= 0.999:
            parts.append(
                f"Serving kept its p99 within the SLO ({slo_ms:.0f} ms) in windows carrying "
                f"{_pct(att)} of requests (worst window p99 {worst_s})."
            )
        else:
            parts.append(
                f"Serving met its p99 SLO ({slo_ms:.0f} ms) in windows carrying {_pct(att)} of "
                f"requests; {_pct(1 - att)} of requests fell in windows whose p99 exceeded it "
                f"(worst window p99 {worst_s})."
            )
        parts.append(
            f"Over the run {_pct(sv.get('requests_within_slo', 1.0))} of requests were answered "
            f"within {slo_ms:.0f} ms; the p99 of all requests was {p99_s}."
        )
    tq = m["queue_delay_s"].get("training")
    ta = m.get("queue_delay_all_s", {}).get("training")
    if tq:
        parts.append(
            f"Training waited p50 {_dur(tq['p50'])}, p99 {_dur(tq['p99'])} for its GPUs "
            f"({tq.get('n', 0)} jobs that started)"
            + (
                f"; counting the {ta['censored']} still waiting at the horizon, p99 is at least "
                f"{_dur(ta['p99'])}."
                if ta and ta.get("censored")
                else "."
            )
        )
    pre = m["preemptions"]
    by_cause = pre.get("gpu_hours_lost_by_cause", {})
    causes = ", ".join(f"{k.replace('_', ' ')}: {v:.1f}" for k, v in by_cause.items() if v)
    if pre["count"]:
        reasons = ", ".join(f"{k}: {v}" for k, v in pre["by_reason"].items())
        parts.append(f"{pre['count']} preemptions ({reasons}).")
    else:
        parts.append("No preemptions.")
    if pre["gpu_hours_lost"]:
        parts.append(f"{pre['gpu_hours_lost']:.1f} GPU-hours of work were lost ({causes}).")
    rec = m["reclaims"]
    if rec["count"]:
        parts.append(f"{rec['count']} reclaims returned {rec['gpu_hours_returned']:.1f} GPU-hours.")
    g = m["gpu"]
    parts.append(
        f"GPUs were {g['allocation_ratio']:.0%} allocated and {g['utilization']:.0%} busy on "
        f"average; {g['fragmentation']:.1%} of capacity sat in fragments."
    )
    ic = m.get("interconnect", {})
    links = [
        f"{label} max {ic[k]['max']:.0%} (p95 {ic[k]['p95']:.0%})"
        for k, label in (("node_uplink", "node uplinks"), ("rack_uplink", "rack uplinks"))
        if k in ic
    ]
    if links:
        parts.append("Links: " + ", ".join(links) + ".")
    if m["invariant_violations"]:
        parts.append(f"WARNING: {m['invariant_violations']} invariant violations.")
    return " ".join(parts)


def _cell(x: Any, fmt: str = "{:.4f}") -> str:
    if x is None:
        return "overload"
    if isinstance(x, float) and math.isnan(x):
        return "-"
    return fmt.format(x)


def _summary_rows(runs: list[PolicyRun], metrics: dict[str, Any]) -> str:
    rows = []
    for run in runs:
        m = metrics["policies"][run.policy]
        q = m["queue_delay_s"].get("training", {"p50": math.nan, "p99": math.nan})
        qa = m.get("queue_delay_all_s", {}).get("training", {"p99": math.nan, "censored": 0})
        sv = m["serving"]
        has = bool(sv.get("services"))
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{c}</td>"
                for c in (
                    html.escape(run.policy),
                    _cell(sv["slo_attainment"]) if has else "-",
                    _cell(sv["p99_ms"], "{:.0f}") if has else "-",
                    _cell(sv.get("worst_window_p99_ms"), "{:.0f}") if has else "-",
                    _dur(q["p50"]),
                    _dur(q["p99"]),
                    f"{_dur(qa['p99'])} ({qa.get('censored', 0)})",
                    str(m.get("pending_at_end", "-")),
                    str(m["preemptions"]["count"]),
                    f"{m['preemptions']['gpu_hours_lost']:.1f}",
                    str(m["reclaims"]["count"]),
                    f"{m['gpu']['allocation_ratio']:.3f}",
                    f"{m['gpu']['fragmentation']:.3f}",
                    str(m["invariant_violations"]),
                )
            )
            + "</tr>"
        )
    return "".join(rows)


_HEAD = (
    "policy",
    "serving SLO attainment",
    "p99 ms (all requests)",
    "worst window p99 ms",
    "training wait p50 (started)",
    "training wait p99 (started)",
    "training wait p99, all (censored)",
    "pending at end",
    "preemptions",
    "GPU-h lost",
    "reclaims",
    "GPU allocation",
    "fragmentation",
    "invariant violations",
)


def _interval_table(intervals: dict[str, dict[str, dict[str, Any]]], seeds: list[int]) -> str:
    figures = sorted({f for per in intervals.values() for f in per})
    head = "".join(f"<th>{html.escape(p)}</th>" for p in intervals)
    body = []
    for fig in figures:
        cells = []
        hours = "_s." in fig and not fig.endswith("censored")  # shown in hours, as sim's table
        for per in intervals.values():
            iv = per.get(fig)
            if iv is None or iv["mean"] is None:
                cells.append("<td>-</td>" if iv is None else "<td>overload</td>")
                continue
            k = 1 / 3600 if hours else 1.0
            lo, m, hi = iv["ci95_low"] * k, iv["mean"] * k, iv["ci95_high"] * k
            cells.append(f"<td>{m:.4g} [{lo:.4g}, {hi:.4g}]{' h' if hours else ''}</td>")
        body.append(f"<tr><td>{html.escape(fig)}</td>{''.join(cells)}</tr>")
    return (
        f"<h2>Headline figures over seeds {', '.join(map(str, seeds))}: mean [95 % interval]</h2>"
        f"<table><tr><th>figure</th>{head}</tr>{''.join(body)}</table>"
    )


def render(
    title: str,
    runs: list[PolicyRun],
    metrics: dict[str, Any],
    intervals: dict[str, dict[str, dict[str, Any]]] | None = None,
) -> str:
    sections = []
    for run in runs:
        m = metrics["policies"][run.policy]
        slug = "".join(ch if ch.isalnum() else "-" for ch in run.policy)
        name = html.escape(run.policy)
        says = html.escape(verdict(run.policy, m))
        # REPORT#joint-POLICY shows this block alone, full window (links, screenshots)
        joint = (
            f'<div class=joint id="joint-{slug}"><h3>{name}: joint view (one time axis)</h3>'
            f'<p class=verdict>{says}</p><img src="{plot_joint(run)}" alt="joint view"></div>'
        )
        rest = "".join(
            f'<h3>{h}</h3><img src="{src}" alt="{h}">'
            for h, src in (
                ("Queue delay per class", plot_queue_cdf(run)),
                ("GPUs per partition", plot_partitions(run)),
            )
        )
        rest += html_section(m.get("advice", []), f"Advice for {run.policy}")  # gpufence.advice
        sections.append(f'<section id="{slug}"><h2>{name}</h2>{joint}{rest}</section>')
    seeds = metrics.get("seeds") or [metrics.get("seed")]
    iv = _interval_table(intervals, seeds) if intervals else ""
    note = f"<p>Plots and the table below: seed {metrics.get('seed')}.</p>" if intervals else ""
    head = "".join(f"<th>{h}</th>" for h in _HEAD)
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>{html.escape(title)}</title><style>
body{{font-family:sans-serif;max-width:1150px;margin:2em auto}}
table{{border-collapse:collapse;margin:8px 0}}td,th{{border:1px solid #ccc;padding:4px 8px}}
img{{display:block;margin:8px 0;max-width:100%}}.verdict{{background:#f4f4f4;padding:8px}}
.joint:target{{position:fixed;inset:0;z-index:9;background:#fff;overflow:auto;padding:0 1.5em}}
</style></head><body><h1>{html.escape(title)}</h1>{iv}{note}
<table><tr>{head}</tr>{_summary_rows(runs, metrics)}</table>
{"".join(sections)}</body></html>"""
