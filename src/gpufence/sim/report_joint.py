"""The joint view of a run: one time axis, stacked panels, so cause and effect line up.

Top to bottom: serving request rate and replicas (running, wanted); serving p99 per window
against the SLO; queue delay of training, batch and interactive work (jobs started in each
interval: the longest wait among them, and — dashed — how long the oldest still-waiting job
had waited at each sample, the censored side); link utilisation (busiest node uplink, busiest
rack uplink, the mean over uplinks that carry traffic); preemptions, reclaims and node
failures as marks. A reader sees whether serving misses its SLO while GPUs are free and an
all-reduce loads the links it shares — and whether the fence prevents it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # headless: no display on servers or CI
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from gpufence.model.decisions import Notice, Reason, Stop
from gpufence.sim.latency import INF

if TYPE_CHECKING:
    from gpufence.sim.policy_run import PolicyRun

WAITING_CLASSES = ("training", "batch", "interactive")
_COLOURS = {"training": "tab:blue", "batch": "tab:green", "interactive": "tab:purple"}
_MARKS = (
    ("preemption", (Reason.INCIDENT_PREEMPTION, Reason.ON_DEMAND_PREEMPTION), Notice, "tab:red"),
    ("lent reclaim", (Reason.LENT_RECLAIM,), Notice, "tab:orange"),
    ("idle reclaim", (Reason.IDLE,), Notice, "tab:olive"),
    ("node failure", (Reason.NODE_FAILURE,), Stop, "black"),
)


def joint_figure(run: PolicyRun, bin_s: float = 1800.0) -> Figure:
    fig, axes = plt.subplots(
        5,
        1,
        figsize=(10, 10),
        sharex=True,
        gridspec_kw={"height_ratios": [1.2, 1.2, 1.4, 1.2, 0.7]},
    )
    end_h = max(run.result.end_time, 1.0) / 3600.0
    _serving_load(axes[0], run)
    _serving_p99(axes[1], run)
    _queue_delay(axes[2], run, bin_s)
    _links(axes[3], run)
    _marks(axes[4], run)
    axes[-1].set_xlabel("hours")
    axes[-1].set_xlim(0, end_h)
    fig.suptitle(f"{run.policy}: serving, queue delay and interconnect on one time axis")
    fig.tight_layout()
    return fig


def _serving_load(ax: Axes, run: PolicyRun) -> None:
    if not run.fleets:
        ax.text(0.5, 0.5, "no serving services", ha="center", transform=ax.transAxes)
        ax.set_ylabel("serving")
        return
    twin = ax.twinx()
    for f in run.fleets:
        xs = [w.end / 3600.0 for w in f.windows]
        ax.plot(xs, [w.rate_rps for w in f.windows], lw=1, color="tab:gray", label="req/s")
        twin.plot(xs, [w.replicas for w in f.windows], lw=1, color="tab:blue", label="running")
        twin.plot(xs, [w.target for w in f.windows], lw=1, ls=":", color="tab:blue", label="wanted")
        short = [i for i, w in enumerate(f.windows) if w.replicas < w.target]
        if short:  # the GPUs the autoscaler asked for were not given
            twin.scatter(
                [xs[i] for i in short],
                [f.windows[i].replicas for i in short],
                s=8,
                c="red",
                zorder=3,
                label=f"short of replicas ({len(short)} windows)",
            )
    ax.set_ylabel("requests/s")
    twin.set_ylabel("replicas")
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")


def _serving_p99(ax: Axes, run: PolicyRun) -> None:
    for f in run.fleets:
        f.score()
        cap = f.svc.slo_p99_ms * 4
        xs = [w.end / 3600.0 for w in f.windows]
        ys = [min(w.p99_ms, cap) if w.p99_ms != INF else cap for w in f.windows]
        ax.plot(xs, ys, lw=1, label=f"{f.svc.name} p99")
        ax.axhline(f.svc.slo_p99_ms, color="red", ls="--", lw=1, label=f"SLO {f.svc.slo_p99_ms:g}")
        missed = [i for i, w in enumerate(f.windows) if w.p99_ms > f.svc.slo_p99_ms]
        if missed:
            ax.scatter([xs[i] for i in missed], [ys[i] for i in missed], s=6, c="red", zorder=3)
    ax.set_ylabel("p99 ms\n(overload at 4x SLO)")
    if run.fleets:
        ax.legend(fontsize=7, loc="upper left")


def _queue_delay(ax: Axes, run: PolicyRun, bin_s: float) -> None:
    bins: dict[str, dict[int, float]] = {c: {} for c in WAITING_CLASSES}
    for tr in run.result.jobs.values():
        cls = str(tr.item.job.workload_class)
        if cls in bins and tr.first_start is not None:
            k = int(tr.first_start // bin_s)
            d = (tr.first_start - tr.submitted) / 60.0
            bins[cls][k] = max(bins[cls].get(k, 0.0), d)
    samples = run.timeline.samples
    for cls in WAITING_CLASSES:
        col = _COLOURS[cls]
        if bins[cls]:
            ks = sorted(bins[cls])
            xs = [(k + 0.5) * bin_s / 3600.0 for k in ks]
            ax.plot(xs, [max(bins[cls][k], 0.01) for k in ks], color=col, lw=1, label=f"{cls}")
        waits = [max(s.oldest_wait_s.get(cls, 0.0) / 60.0, 0.01) for s in samples]
        if any(w > 0.01 for w in waits):
            ax.plot([s.t / 3600.0 for s in samples], waits, color=col, lw=1, ls="--")
    ax.set_yscale("log")
    ax.set_ylabel("queue delay, min (log)\nsolid: max started,\ndashed: oldest waiting")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left")


def _links(ax: Axes, run: PolicyRun) -> None:
    samples = run.timeline.samples
    cls = run.timeline.fabric.link_class
    xs = [s.t / 3600.0 for s in samples]
    for kind, label, col in (
        ("node_uplink", "node uplink", "tab:orange"),
        ("rack_uplink", "rack uplink", "tab:red"),
    ):
        busiest = [
            max((u for k, u in s.links.items() if cls[k] == kind), default=0.0) for s in samples
        ]
        ax.plot(xs, busiest, lw=1, color=col, label=f"busiest {label}")
        means = []
        for s in samples:
            vals = [u for k, u in s.links.items() if cls[k] == kind]
            means.append(sum(vals) / len(vals) if vals else 0.0)
        ax.plot(xs, means, lw=1, ls=":", color=col, label=f"mean {label} (carrying traffic)")
    ax.plot(
        xs,
        [s.storage_util for s in samples],
        lw=1,
        color="black",
        ls="-.",
        label="checkpoint storage",
    )
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("link utilisation")
    ax.legend(fontsize=6, loc="upper left", ncol=2)


def _marks(ax: Axes, run: PolicyRun) -> None:
    for y, (label, reasons, kind, col) in enumerate(_MARKS):
        ts = [t / 3600.0 for t, d in run.result.log if isinstance(d, kind) and d.reason in reasons]
        if ts:
            ax.scatter(ts, [y] * len(ts), marker="|", s=60, color=col, label=f"{label} ({len(ts)})")
    ax.set_yticks(range(len(_MARKS)), [m[0] for m in _MARKS], fontsize=7)
    ax.set_ylim(-0.7, len(_MARKS) - 0.3)
