"""``gpufence demo --simulated``: the demo's story (``demo/story.py``) told by the simulator,
with a progress bar per act and what the fence did."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from gpufence.demo.simulated import SEED_JOB_S, SimulatedAct, fenced_surge, sixty_six_jobs
from gpufence.model.decisions import Bind, Notice, Reason, Reject, Requeue, Stop
from gpufence.progress import progress_bar
from gpufence.sim.runner import SimResult, Simulation
from gpufence.sim.summary import (
    decision_line,
    exclusive_overlap,
    handoff_gaps,
    percentile,
    summarize,
)

_SHOWN = (Notice, Stop, Requeue, Reject)


def _run(console: Console, act: SimulatedAct, verbose: bool) -> SimResult:
    if verbose:
        console.print(f"[bold]{act.act.heading}[/bold]: {act.act.shows}")
    sim = Simulation(act.cluster, act.work)
    horizon = max(w.job.submit_time + w.duration_s for w in act.work) * 1.5
    with progress_bar(console, "t={task.completed:,.0f}s") as bar:
        task = bar.add_task(act.act.step("simulating"), total=horizon)
        result = sim.run(progress=lambda t: bar.update(task, completed=min(t, horizon)))
    return result


def counts(by: Mapping[Any, int]) -> str:
    """``done=55, reclaimed=3``: a count per key in words (a state's, a reason's value), never
    Python's repr of the dict (``{<JobState.DONE: 'done'>: 55}``: issue 32)."""
    return ", ".join(f"{getattr(k, 'value', k)}={v}" for k, v in by.items()) or "none"


def _by(by: Mapping[Any, int]) -> str:
    return f" ({counts(by)})" if by else ""


def run_demo(console: Console, verbose: bool = True) -> bool:
    ok = True
    act = sixty_six_jobs()
    r = _run(console, act, verbose)
    s = summarize(r, len(act.cluster.gpus))
    gpus = len(act.cluster.gpus)
    ideal = math.ceil(len(act.work) / gpus) * SEED_JOB_S
    worst = exclusive_overlap(r)
    gaps = handoff_gaps(r)
    t = Table(title=act.act.heading, show_header=False)
    t.add_row("jobs completed / submitted", f"{s['completed']} / {s['submitted']}")
    t.add_row("max jobs per GPU at any instant", str(worst))
    t.add_row(
        "makespan vs ideal", f"{r.end_time:,.0f} s vs {ideal:,.0f} s ({r.end_time / ideal:.3f}x)"
    )
    t.add_row(
        "GPU hand-off gap p50 / p99",
        f"{percentile(gaps, 50):.3f} s / {percentile(gaps, 99):.3f} s (virtual clock)",
    )
    t.add_row("invariant violations", str(s["invariant_violations"]))
    console.print(t)
    ok &= s["completed"] == s["submitted"] and worst == 1 and s["invariant_violations"] == 0

    act = fenced_surge()
    r = _run(console, act, verbose)
    s = summarize(r, len(act.cluster.gpus))
    if verbose:
        console.print(f"[bold]{act.act.heading}: what the fence decided[/bold]")
        for when, d in r.log:
            interesting = isinstance(d, _SHOWN) or (
                isinstance(d, Bind) and d.reason in (Reason.LENT, Reason.INCIDENT)
            )
            if interesting:
                console.print(decision_line(when, d), markup=False, highlight=False, soft_wrap=True)
    t = Table(title=act.act.heading, show_header=False)
    t.add_row(
        "jobs completed / submitted",
        f"{s['completed']} / {s['submitted']} (states: {counts(s['states'])})",
    )
    for cls in ("serving", "training", "interactive", "batch"):
        q = s["queue_delay_s"].get(cls)
        if q:
            t.add_row(f"queue delay {cls} p50 / p99", f"{q['p50']:,.0f} s / {q['p99']:,.0f} s")
    pre, rec = s["preemptions"], s["reclaims"]
    t.add_row("incident preemptions", f"{sum(pre.values())}{_by(pre)}")
    t.add_row("reclaims", f"{sum(rec.values())}{_by(rec)}")
    t.add_row("GPU allocation (time average)", f"{s['gpu']['allocation_ratio']:.1%}")
    t.add_row("max jobs per exclusive GPU", str(exclusive_overlap(r)))
    t.add_row("invariant violations", str(s["invariant_violations"]))
    console.print(t)
    ok &= s["invariant_violations"] == 0 and exclusive_overlap(r) == 1
    ok &= s["completed"] + s["states"].get("reclaimed", 0) == s["submitted"]
    console.print("[green]demo ok[/green]" if ok else "[red]demo found a problem[/red]")
    return bool(ok)
