"""What an experiment writes: ``metrics.json``, ``report.html``, ``events.csv`` and, on
request, ``links.csv`` — the one writer of ``gpufence sim``, ``gpufence size --json`` (its JSON
form) and scripts that run ``sim.experiment.run_experiment``.

``metrics.json`` is ``result.metrics`` with sorted keys (so two runs diff line by line);
``events.csv`` one row per decision of the first seed's runs (policy, time, ``Name field=value
...``); ``links.csv`` each busy link's utilisation per timeline sample.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from gpufence.sim.experiment import ExperimentResult
from gpufence.sim.policy_run import PolicyRun
from gpufence.sim.summary import decision_text


def write_json(path: Path, obj: Any) -> Path:
    """``obj`` as the outputs' JSON: indented, keys sorted, one final newline."""
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    return path


def write_outputs(result: ExperimentResult, out: Path, link_timeline: bool = False) -> list[Path]:
    """Write the experiment's files into ``out`` (created if missing); the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    runs = result.runs
    written = [write_json(out / "metrics.json", result.metrics)]
    from gpufence.sim.report import render  # matplotlib is imported only when reporting

    title = f"gpufence sim: {result.scenario.name}"
    html = render(title, runs, result.metrics, result.intervals)
    (out / "report.html").write_text(html)
    written += [out / "report.html", write_events(out / "events.csv", runs)]
    if link_timeline:
        written.append(write_link_timeline(out / "links.csv", runs))
    return written


def write_events(path: Path, runs: list[PolicyRun]) -> Path:
    """Every decision of every run: policy, time (s), the decision as text."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "time_s", "decision"])
        for r in runs:
            for t, d in r.result.log:
                w.writerow([r.policy, f"{t:.3f}", decision_text(d)])
    return path


def write_link_timeline(path: Path, runs: list[PolicyRun]) -> Path:
    """Per-link utilisation over time: one row per (policy, sample, link carrying traffic)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "time_s", "link", "link_class", "utilization"])
        for r in runs:
            cls = r.timeline.fabric.link_class
            for s in r.timeline.samples:
                for link, u in sorted(s.links.items()):
                    w.writerow([r.policy, f"{s.t:.0f}", link, cls[link], f"{u:.4f}"])
    return path
