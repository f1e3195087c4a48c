"""``gpufence sim`` and ``gpufence size``: run scenarios under policies, write the results."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import TaskID
from rich.table import Table

from gpufence.cli.lint import lint_file
from gpufence.model.cluster import Cluster
from gpufence.progress import progress_bar
from gpufence.sched.registry import SCORERS
from gpufence.sim.advice_run import add_advice, scenario_inputs
from gpufence.sim.experiment import PolicyRun, run_policy
from gpufence.sim.generate import generate
from gpufence.sim.policies import POLICIES, with_placement
from gpufence.sim.report_text import dur as _dur
from gpufence.sim.runner import At, WorkItem
from gpufence.sim.scenario import Scenario, load_scenario
from gpufence.sim.summary import decision_line
from gpufence.spec import SpecError, load_cluster


def check_scenario(sc: Scenario, cluster: Cluster) -> None:
    """Scenario fields that name partitions or queues must exist in the cluster."""
    problems: list[str] = []
    parts = ", ".join(cluster.partitions)
    queues = ", ".join(cluster.queues)

    def part(path: str, name: str) -> None:
        if name not in cluster.partitions:
            problems.append(
                f"{path}: '{name}' is not a partition of {cluster.name} (known: {parts})"
            )

    def queue(path: str, name: str) -> None:
        if name and name not in cluster.queues:
            problems.append(f"{path}: '{name}' is not a queue of {cluster.name} (known: {queues})")

    for i, svc in enumerate(sc.services):
        if svc.queue:
            queue(f"services[{i}].queue", svc.queue)
        else:
            part(f"services[{i}].partition", svc.partition)
    if sc.training is not None:
        for i, q in enumerate(sc.training.queues):
            queue(f"training.queues[{i}]", q)
        if not sc.training.queues:
            part("training.partition", sc.training.partition)
    if sc.notebooks is not None:
        part("notebooks.partition", sc.notebooks.partition)
    if sc.batch is not None:
        part("batch.partition", sc.batch.partition)
    if problems:
        raise SpecError(problems, kind="scenario")


def load_inputs(cluster_path: Path, workload: Path, seed: int | None) -> tuple[Scenario, Cluster]:
    sc, _ = load_scenario(workload)
    if seed is not None:
        sc = sc.model_copy(update={"seed": seed})
    cluster = load_cluster(cluster_path)
    check_scenario(sc, cluster)
    return sc, cluster


def trace_format(workload: Path, fmt: str | None) -> str | None:
    """The trace format of ``workload``, or None for a scenario YAML (the default path: a
    ``.yaml``/``.yml`` name, or any file no trace format recognises that is a YAML mapping)."""
    from gpufence.sim.workloads.trace_formats import FORMATS, TraceFormatError, detect

    if fmt is not None:
        if fmt not in FORMATS:
            raise SpecError(
                [f"--format: unknown format '{fmt}' (known: {', '.join(FORMATS)})"],
                kind="command line",
            )
        return fmt
    if workload.suffix.lower() in (".yaml", ".yml"):
        return None
    if not workload.is_file():
        raise FileNotFoundError(f"'{workload}' not found (a scenario YAML or a trace file)")
    try:
        return detect(workload)
    except TraceFormatError:
        if _yaml_mapping(workload):
            return None
        raise


def _yaml_mapping(path: Path) -> bool:
    import yaml

    try:
        return isinstance(yaml.safe_load(path.read_text()), dict)
    except (yaml.YAMLError, UnicodeDecodeError):
        return False


def load_trace_inputs(
    console: Console,
    cluster_path: Path,
    trace: Path,
    fmt: str,
    seed: int | None,
    slo_p99_ms: float | None,
) -> tuple[Scenario, Cluster, list[WorkItem]]:
    """A trace replayed on its own times: the scenario that frames it, the cluster, the jobs."""
    from gpufence.sim.workloads.trace_formats import load_trace

    if not trace.is_file():
        raise FileNotFoundError(f"trace file '{trace}' not found")
    cluster = load_cluster(cluster_path)
    tw = load_trace(trace, fmt, cluster, slo_p99_ms)
    sc = Scenario(
        name=trace.stem,
        horizon_s=tw.horizon_s,
        seed=seed or 0,
        sample_every_s=max(300.0, tw.horizon_s / 500),
        services=tw.services,
    )
    console.print(tw.note)
    return sc, cluster, tw.work


def run_sim(
    console: Console,
    cluster_path: Path,
    workload: Path,
    policies: list[str],
    out: Path,
    seed: int | None,
    placement: str | None = None,
    strict: bool = False,
    fmt: str | None = None,
    slo_p99_ms: float | None = None,
) -> dict[str, Any]:
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise SpecError(
            [f"--policy: unknown policy {', '.join(unknown)} (known: {', '.join(POLICIES)})"],
            kind="command line",
        )
    kind = trace_format(workload, fmt)
    if kind is None:
        sc, cluster = load_inputs(cluster_path, workload, seed)
        lint_file(console, cluster, cluster_path, strict, base=scenario_inputs(sc, cluster))
        work, events = generate(sc, cluster)
    else:  # a public trace, replayed on its own times
        sc, cluster, work = load_trace_inputs(
            console, cluster_path, workload, kind, seed, slo_p99_ms
        )
        lint_file(console, cluster, cluster_path, strict)
        events = list[At]()
    if placement is not None:
        if placement not in SCORERS:
            known = ", ".join(sorted(SCORERS))
            raise SpecError(
                [f"--placement: unknown policy '{placement}' (known: {known})"],
                kind="command line",
            )
        cluster = with_placement(cluster, placement)
    runs: list[PolicyRun] = []
    status = "{task.percentage:>3.0f}% of simulated time"
    with progress_bar(console, status, transient=False) as bar:
        for name in policies:
            task = bar.add_task(name, total=sc.horizon_s)

            def tick(t: float, task: TaskID = task) -> None:
                bar.update(task, completed=min(t, sc.horizon_s))

            runs.append(run_policy(sc, cluster, name, work, events, progress=tick))
            bar.update(task, completed=sc.horizon_s)
    metrics: dict[str, Any] = {
        "scenario": sc.name,
        "cluster": cluster.name,
        "seed": sc.seed,
        "horizon_s": sc.horizon_s,
        "policies": {r.policy: r.metrics for r in runs},
    }
    add_advice(metrics, sc, runs)  # metrics["policies"][P]["advice"]: why each policy loses
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    from gpufence.sim.report import render  # matplotlib is imported only when reporting

    (out / "report.html").write_text(render(f"gpufence sim: {sc.name}", runs, metrics))
    with open(out / "events.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "time_s", "decision"])
        for r in runs:
            for t, d in r.result.log:
                w.writerow([r.policy, f"{t:.3f}", decision_line(t, d).split(" ", 1)[1].strip()])
    console.print(summary_table(metrics))
    for name, m in metrics["policies"].items():
        for a in m.get("advice", []):
            line = f"advice for {name}: {a['evidence'].get('summary', '')} [{a['rule']}]"
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {out / 'metrics.json'}, {out / 'report.html'}, {out / 'events.csv'}")
    return metrics


def summary_table(metrics: dict[str, Any]) -> Table:
    t = Table(title=f"{metrics['scenario']} on {metrics['cluster']} (seed {metrics['seed']})")
    for col in (
        "policy",
        "SLO att.",
        "p99 ms",
        "train p50",
        "train p99",
        "preempt",
        "reclaim",
        "alloc",
        "done/sub",
        "viol.",
    ):
        t.add_column(col, justify="right")
    for name, m in metrics["policies"].items():
        q = m["queue_delay_s"].get("training", {"p50": 0.0, "p99": 0.0})
        p99 = m["serving"]["p99_ms"]
        t.add_row(
            name,
            f"{m['serving']['slo_attainment']:.4f}",
            "overload" if p99 is None else f"{p99:.0f}",
            _dur(q["p50"]),
            _dur(q["p99"]),
            str(m["preemptions"]["count"]),
            str(m["reclaims"]["count"]),
            f"{m['gpu']['allocation_ratio']:.3f}",
            f"{m['completed']}/{m['submitted']}",
            str(m["invariant_violations"]),
        )
    return t
