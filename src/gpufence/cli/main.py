"""The ``gpufence`` typer app: each verb group registers itself; ``validate`` lives here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from gpufence.cli.control import register as register_control_verbs
from gpufence.sched import registry
from gpufence.spec import SpecError, format_spec_error

app = typer.Typer(
    help="gpufence: a GPU cluster scheduler that fences training, serving, interactive and batch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# wide enough for the summary tables when output goes to a file or CI log
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True)


@app.command()
def validate(
    cluster: Annotated[Path, typer.Argument(help="cluster YAML file")],
) -> None:
    """Check a cluster spec and print its partitions (fences)."""
    from gpufence.control.config import control_schema
    from gpufence.spec import load_cluster_with_sections

    c, extra, _lines = load_cluster_with_sections(cluster, ("control",))
    control_schema(extra.get("control"), str(cluster))  # shape only: secrets resolve at `up`
    table = Table(title=f"cluster {c.name}: {len(c.nodes)} nodes, {len(c.gpus)} GPUs")
    for col in ("partition", "GPUs", "nodes", "admits", "sharing", "lends", "preemption"):
        table.add_column(col)
    for name, part in c.partitions.items():
        lends = ", ".join(f"{r.cap_gpus} to {'/'.join(r.to)}" for r in part.lending) or "-"
        table.add_row(
            name,
            str(len(c.partition_gpus[name])),
            str(len(c.partition_nodes[name])),
            ", ".join(sorted(part.admits)),
            str(part.sharing),
            lends,
            str(part.preemption.mode),
        )
    console.print(table)
    console.print(f"[green]ok[/green]: {cluster} is valid")


@app.command()
def demo(
    quiet: Annotated[bool, typer.Option("--quiet", help="only the summaries")] = False,
    fake_gpus: Annotated[
        int | None,
        typer.Option("--fake-gpus", help="use N fake GPUs even when real ones are present"),
    ] = None,
    simulated: Annotated[
        bool,
        typer.Option("--simulated", help="the same story in the simulator (virtual clock)"),
    ] = False,
) -> None:
    """The main job: the control plane on this machine's GPUs (8 fake ones if there are none)
    runs the seed's 66-job case and a fenced machine through a serving surge, with real
    processes, then prints what happened."""
    if simulated:
        from gpufence.cli.demo import run_demo as run_simulated

        ok = run_simulated(console, verbose=not quiet)
    else:
        from gpufence.demo.live import run_demo

        ok = run_demo(console, fake=fake_gpus, verbose=not quiet)
    if not ok:
        raise typer.Exit(code=1)


@app.command()
def sim(
    cluster: Annotated[Path, typer.Argument(help="cluster YAML file")],
    workload: Annotated[Path, typer.Argument(help="scenario YAML, or an openb pod-list CSV")],
    policy: Annotated[
        list[str],
        typer.Option("--policy", "-p", help="policy to run; repeat to compare"),
    ],
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("out/sim"),
    seed: Annotated[int | None, typer.Option("--seed", help="override the scenario seed")] = None,
    placement: Annotated[
        str | None,
        typer.Option(
            "--placement",
            help="fractional placement: " + ", ".join(registry.names("placement policy")),
        ),
    ] = None,
) -> None:
    """Replay a workload through the scheduler under one or more policies; write
    OUT/metrics.json, OUT/report.html and OUT/events.csv."""
    from gpufence.cli.sim import run_sim

    run_sim(console, cluster, workload, policy, out, seed, placement)


@app.command()
def size(
    cluster: Annotated[Path, typer.Argument(help="cluster YAML file")],
    workload: Annotated[Path, typer.Argument(help="scenario YAML with serving services")],
    slo_p99_ms: Annotated[float, typer.Option("--slo-p99-ms", help="serving p99 target (ms)")],
    failure_margin: Annotated[
        int, typer.Option("--failure-margin", help="node failures the fence must absorb")
    ] = 1,
    seed: Annotated[int | None, typer.Option("--seed", help="override the scenario seed")] = None,
) -> None:
    """The smallest serving fence meeting the SLO at peak with K failures, and its cost."""
    from gpufence.cli.sim import load_inputs
    from gpufence.sim.sizing import size_fence

    if slo_p99_ms <= 0 or failure_margin < 0:
        raise typer.BadParameter("--slo-p99-ms must be > 0 and --failure-margin >= 0")
    sc, c = load_inputs(cluster, workload, seed)
    ans = size_fence(sc, c, slo_p99_ms, failure_margin)
    console.print(
        f"[bold]serving fence: {ans.fence_nodes} nodes = {ans.fence_gpus} GPUs[/bold] "
        f"({ans.replicas_at_peak} replicas at peak + {ans.margin_replicas} GPUs of margin)"
    )
    for line in ans.explanation:
        console.print("  " + line, markup=False, highlight=False, soft_wrap=True)


register_control_verbs(app)  # up, submit, queue, status, explain, cancel, logs, nodes, top


def main() -> None:
    """Entry point: bad input ends with a clear message and exit code 2, never a traceback."""
    try:
        app()
    except SpecError as e:
        err_console.print(format_spec_error(e), markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except ValueError as e:  # a request no configuration can satisfy, named by its field
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except FileNotFoundError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
