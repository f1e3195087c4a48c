"""``gpufence sim`` and ``gpufence size``: run scenarios under policies, write the results."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import TaskID
from rich.table import Table

from gpufence.cli.speclint import lint_file
from gpufence.model.cluster import Cluster
from gpufence.progress import progress_bar
from gpufence.sched.registry import SCORERS
from gpufence.sim.advice_run import add_advice, scenario_inputs
from gpufence.sim.generate import generate
from gpufence.sim.headline import HEADLINE, headline_intervals
from gpufence.sim.policies import POLICIES, with_placement
from gpufence.sim.policy_run import PolicyRun, run_policy
from gpufence.sim.report_text import dur as _dur
from gpufence.sim.scenario import Scenario, load_scenario
from gpufence.sim.summary import decision_text
from gpufence.sim.workloads.records import At, WorkItem
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


def parse_seeds(text: str) -> list[int]:
    """``1..5`` (inclusive range) or ``1,3,7``."""
    try:
        if ".." in text:
            lo, hi = text.split("..")
            seeds = list(range(int(lo), int(hi) + 1))
        else:
            seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        seeds = []
    if not seeds:
        raise SpecError(
            [f"--seeds: '{text}' is not a seed list (write 1..5 or 1,3,7)"], kind="command line"
        )
    return seeds


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
    seeds: list[int] | None = None,
    link_timeline: bool = False,
) -> dict[str, Any]:
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise SpecError(
            [f"--policy: unknown policy {', '.join(unknown)} (known: {', '.join(POLICIES)})"],
            kind="command line",
        )
    if placement is not None and placement not in SCORERS:
        known = ", ".join(sorted(SCORERS))
        raise SpecError(
            [f"--placement: unknown policy '{placement}' (known: {known})"], kind="command line"
        )
    if seeds is not None and seed is not None:
        raise SpecError(["--seed and --seeds: give one of them"], kind="command line")
    by_seed: dict[int, list[PolicyRun]] = {}
    sc: Scenario | None = None
    cluster: Cluster | None = None
    kind = trace_format(workload, fmt)
    for s in seeds if seeds is not None else [seed]:
        sc, cluster, work, events = _inputs(
            console, cluster_path, workload, kind, s, slo_p99_ms, placement
        )
        if not by_seed:  # the spec lint, once (the cluster is the same for every seed)
            base = scenario_inputs(sc, cluster) if kind is None else None
            lint_file(console, cluster, cluster_path, strict, base=base)
        by_seed[sc.seed] = _run_all(console, sc, cluster, policies, work, events, len(by_seed))
    assert sc is not None and cluster is not None
    first = next(iter(by_seed))
    runs = by_seed[first]
    metrics: dict[str, Any] = {
        "scenario": sc.name,
        "cluster": cluster.name,
        "seed": first,
        "horizon_s": sc.horizon_s,
        "policies": {r.policy: r.metrics for r in runs},
    }
    intervals = None
    if len(by_seed) > 1:
        metrics["seeds"] = list(by_seed)
        metrics["by_seed"] = {str(k): {r.policy: r.metrics for r in v} for k, v in by_seed.items()}
        intervals = headline_intervals(
            {
                p: [m["policies"][p] for m in [_as_metrics(v) for v in by_seed.values()]]
                for p in policies
            }
        )
        metrics["intervals"] = intervals
    add_advice(metrics, sc, runs)  # metrics["policies"][P]["advice"]: why each policy loses
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    from gpufence.sim.report import render  # matplotlib is imported only when reporting

    (out / "report.html").write_text(render(f"gpufence sim: {sc.name}", runs, metrics, intervals))
    with open(out / "events.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "time_s", "decision"])
        for r in runs:
            for t, d in r.result.log:
                w.writerow([r.policy, f"{t:.3f}", decision_text(d)])
    written = [out / "metrics.json", out / "report.html", out / "events.csv"]
    if link_timeline:
        written.append(write_link_timeline(out / "links.csv", runs))
    console.print(summary_table(metrics))
    if intervals:
        console.print(interval_table(intervals, list(by_seed)))
    for name, m in metrics["policies"].items():
        for a in m.get("advice", []):
            line = f"advice for {name}: {a['evidence'].get('summary', '')} [{a['rule']}]"
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print("wrote " + ", ".join(str(p) for p in written))
    return metrics


def _as_metrics(runs: list[PolicyRun]) -> dict[str, Any]:
    return {"policies": {r.policy: r.metrics for r in runs}}


def _inputs(
    console: Console,
    cluster_path: Path,
    workload: Path,
    kind: str | None,
    seed: int | None,
    slo_p99_ms: float | None,
    placement: str | None,
) -> tuple[Scenario, Cluster, list[WorkItem], list[At]]:
    """One seed's scenario, cluster and workload: generated from a scenario YAML (``kind`` None)
    or a public trace replayed on its own times."""
    if kind is None:
        sc, cluster = load_inputs(cluster_path, workload, seed)
        work, events = generate(sc, cluster)
    else:
        sc, cluster, work = load_trace_inputs(
            console, cluster_path, workload, kind, seed, slo_p99_ms
        )
        events = list[At]()
    if placement is not None:
        cluster = with_placement(cluster, placement)
    return sc, cluster, work, events


def _run_all(
    console: Console,
    sc: Scenario,
    cluster: Cluster,
    policies: list[str],
    work: list[WorkItem],
    events: list[At],
    index: int,
) -> list[PolicyRun]:
    runs: list[PolicyRun] = []
    status = "{task.percentage:>3.0f}% of simulated time"
    with progress_bar(console, status, transient=False) as bar:
        for name in policies:
            label = name if index == 0 else f"{name} (seed {sc.seed})"
            task = bar.add_task(label, total=sc.horizon_s)

            def tick(t: float, task: TaskID = task) -> None:
                bar.update(task, completed=min(t, sc.horizon_s))

            runs.append(run_policy(sc, cluster, name, work, events, progress=tick))
            bar.update(task, completed=sc.horizon_s)
    return runs


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


def _wait_class(m: dict[str, Any]) -> str:
    """The class whose wait the table shows: training when there is any, else all jobs."""
    return "training" if "training" in m["queue_delay_all_s"] else "all"


def summary_table(metrics: dict[str, Any]) -> Table:
    """One row per policy: serving, waits (started and all, censored), jobs, incidents."""
    t = Table(title=f"{metrics['scenario']} on {metrics['cluster']} (seed {metrics['seed']})")
    any_m = next(iter(metrics["policies"].values()))
    wc = _wait_class(any_m)
    who = "train" if wc == "training" else "wait"
    cols: tuple[str, ...] = ("policy", "SLO att.", "p99 ms", f"{who} p50", f"{who} p99")
    cols += (f"{who} p99 all", "pending", "rejected", "preempt", "lost GPU-h", "reclaim")
    cols += ("alloc", "done/sub")
    for col in (*cols, "viol."):
        t.add_column(col, justify="right", no_wrap=col in ("pending", "rejected", "done/sub"))
    for name, m in metrics["policies"].items():
        q = m["queue_delay_s"].get(wc, {"p50": 0.0, "p99": 0.0})
        qa = m["queue_delay_all_s"].get(wc, {"p99": 0.0, "censored": 0})
        sv = m["serving"]
        has = bool(sv.get("services"))
        p99 = sv["p99_ms"]
        t.add_row(
            name,
            f"{sv['slo_attainment']:.4f}" if has else "-",
            ("overload" if p99 is None else f"{p99:.0f}") if has else "-",
            _dur(q["p50"]),
            _dur(q["p99"]),
            f"{_dur(qa['p99'])} ({qa.get('censored', 0)})",
            str(m.get("pending_at_end", 0)),
            str(m["rejected"]),
            str(m["preemptions"]["count"]),
            f"{m['preemptions']['gpu_hours_lost']:.1f}",
            str(m["reclaims"]["count"]),
            f"{m['gpu']['allocation_ratio']:.3f}",
            f"{m['completed']}/{m['submitted']}",
            str(m["invariant_violations"]),
        )
    return t


def interval_table(intervals: dict[str, dict[str, dict[str, Any]]], seeds: list[int]) -> Table:
    t = Table(title=f"mean [95 % interval] over seeds {seeds[0]}..{seeds[-1]} (n={len(seeds)})")
    t.add_column("figure")
    for p in intervals:
        t.add_column(p, justify="right")
    figures = [f for f in HEADLINE if any(f in per for per in intervals.values())]
    for fig in figures:
        cells = []
        for per in intervals.values():
            iv = per.get(fig)
            cells.append("-" if iv is None else _fmt_interval(fig, iv))
        t.add_row(fig, *cells)
    return t


def _fmt_interval(fig: str, iv: dict[str, Any]) -> str:
    m, lo, hi = iv["mean"], iv["ci95_low"], iv["ci95_high"]
    if m is None:
        return "overload"
    if "_s." in fig and not fig.endswith("censored"):
        return f"{m / 3600:.2f} h [{lo / 3600:.2f}, {hi / 3600:.2f}]"
    return f"{m:.4g} [{lo:.4g}, {hi:.4g}]"
