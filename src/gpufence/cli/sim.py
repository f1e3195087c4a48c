"""``gpufence sim``: check the arguments, run ``sim.experiment.run_experiment`` with a console
that shows it, write its outputs (``sim.outputs``) and print the tables."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from gpufence.cli.speclint import lint_file
from gpufence.progress import progress_bar
from gpufence.sched.registry import SCORERS
from gpufence.sim.advice_run import scenario_inputs
from gpufence.sim.experiment import ExperimentResult, Tick, Watch, run_experiment
from gpufence.sim.headline import HEADLINE
from gpufence.sim.inputs import FileInputs, SeedInputs
from gpufence.sim.outputs import write_outputs
from gpufence.sim.policies import POLICIES
from gpufence.sim.report_text import dur as _dur
from gpufence.sim.scenario import Scenario
from gpufence.spec import SpecError


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
    check_arguments(policies, placement, seed, seeds)
    files = FileInputs.open(cluster_path, workload, fmt, slo_p99_ms, placement)
    watch = ConsoleWatch(console, cluster_path, strict, scenario=files.kind is None)
    result = run_experiment(files, policies, seeds if seeds is not None else [seed], watch)
    written = write_outputs(result, out, link_timeline)
    print_result(console, result)
    console.print("wrote " + ", ".join(str(p) for p in written))
    return result.metrics


def check_arguments(
    policies: list[str], placement: str | None, seed: int | None, seeds: list[int] | None
) -> None:
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


class ConsoleWatch(Watch):
    """The experiment on the console: a trace's note as it loads, the spec lint once (the
    cluster is the same for every seed), one progress bar per seed with a row per policy."""

    def __init__(self, console: Console, cluster_path: Path, strict: bool, scenario: bool):
        self.console = console
        self.cluster_path = cluster_path
        self.strict = strict
        self.scenario = scenario  # a scenario YAML (the lint gets its serving peaks), not a trace
        self._bar: Progress | None = None

    def loaded(self, index: int, inputs: SeedInputs) -> None:
        if inputs.note is not None:
            self.console.print(inputs.note)
        if index == 0:
            base = scenario_inputs(inputs.scenario, inputs.cluster) if self.scenario else None
            lint_file(self.console, inputs.cluster, self.cluster_path, self.strict, base=base)

    @contextmanager
    def seed(self, index: int, inputs: SeedInputs) -> Iterator[None]:
        status = "{task.percentage:>3.0f}% of simulated time"
        with progress_bar(self.console, status, transient=False) as bar:
            self._bar = bar
            try:
                yield
            finally:
                self._bar = None

    def policy(self, index: int, sc: Scenario, policy: str) -> Tick:
        bar = self._bar
        assert bar is not None, "a policy runs inside its seed"
        label = policy if index == 0 else f"{policy} (seed {sc.seed})"
        task = bar.add_task(label, total=sc.horizon_s)

        def tick(t: float) -> None:
            bar.update(task, completed=min(t, sc.horizon_s))

        return tick


def print_result(console: Console, result: ExperimentResult) -> None:
    """The summary table, the intervals over seeds (several seeds), each policy's advice."""
    metrics = result.metrics
    console.print(summary_table(metrics))
    if result.intervals:
        console.print(interval_table(result.intervals, result.seeds))
    if result.paired:
        console.print(paired_table(result.paired, str(metrics["paired"]["baseline"]), result.seeds))
    for name, m in metrics["policies"].items():
        for a in m.get("advice", []):
            line = f"advice for {name}: {a['evidence'].get('summary', '')} [{a['rule']}]"
            console.print(line, markup=False, highlight=False, soft_wrap=True)


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


def paired_table(
    paired: dict[str, dict[str, dict[str, Any]]], baseline: str, seeds: list[int]
) -> Table:
    """Each policy minus ``baseline``, seed by seed (the seeds are shared): mean [95 %]."""
    t = Table(
        title=f"paired difference from {baseline}, seed by seed (n={len(seeds)}): mean [95 %]"
    )
    t.add_column("figure")
    for p in paired:
        t.add_column(f"{p} - {baseline}", justify="right")
    figures = [f for f in HEADLINE if any(f in per for per in paired.values())]
    for fig in figures:
        t.add_row(
            fig,
            *(
                "-" if (iv := per.get(fig)) is None else _fmt_interval(fig, iv)
                for per in paired.values()
            ),
        )
    return t


def _fmt_interval(fig: str, iv: dict[str, Any]) -> str:
    m, lo, hi = iv["mean"], iv["ci95_low"], iv["ci95_high"]
    if m is None:
        return "overload"
    if "_s." in fig and not fig.endswith("censored"):
        return f"{m / 3600:.2f} h [{lo / 3600:.2f}, {hi / 3600:.2f}]"
    return f"{m:.4g} [{lo:.4g}, {hi:.4g}]"
