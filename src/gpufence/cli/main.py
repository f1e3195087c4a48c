"""The ``gpufence`` typer app: each verb group registers itself; ``validate``, ``demo``, ``sim``
and ``size`` live here, with ``--version`` and shell completion.

Shell completion (typer's): ``gpufence --install-completion`` adds it to the current shell's
startup file (bash, zsh, fish, PowerShell); ``gpufence --show-completion`` prints the script.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from gpufence import __version__
from gpufence.cli.control import register as register_control_verbs
from gpufence.cli.examples_verb import examples_app
from gpufence.cli.extras import install_hint, require
from gpufence.cli.helpstyle import use_metavars
from gpufence.cli.k8s_verbs import k8s_app
from gpufence.cli.observability_verb import observability_app
from gpufence.sched import registry
from gpufence.spec import SpecError, format_spec_error

use_metavars()  # help without type tags: `--gpus N`, not `--gpus <int>`
app = typer.Typer(
    help="gpufence: a GPU cluster scheduler that fences training, serving, interactive and batch.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # help paragraphs reflow to the terminal's width
)
# wide enough for the summary tables when output goes to a file or CI log
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpufence {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            callback=_version,
            is_eager=True,
            help="print the version and exit",
        ),
    ] = False,
) -> None:
    """gpufence: a GPU cluster scheduler that fences training, serving, interactive and batch.

    Start a control plane with `gpufence up --fake-gpus 8`, then submit, queue, logs, status.
    The simulator: `gpufence examples list`, `gpufence sim CLUSTER WORKLOAD -p fenced`."""


StrictOpt = Annotated[
    bool, typer.Option("--strict", help="advice warnings are errors (exit code 2)")
]
ClusterArg = Annotated[Path, typer.Argument(metavar="CLUSTER", help="cluster YAML file")]
SeedOpt = Annotated[
    int | None, typer.Option("--seed", metavar="N", help="override the scenario's seed")
]


@app.command()
def validate(
    cluster: ClusterArg,
    strict: StrictOpt = False,
) -> None:
    """Check a cluster spec, print its partitions (fences) and the advice on them."""
    from gpufence.cli.argcheck import check_cluster_arg
    from gpufence.cli.speclint import lint_file
    from gpufence.control.base.config import control_schema
    from gpufence.spec import load_cluster_with_sections

    check_cluster_arg("validate", cluster, None)
    c, extra, lines = load_cluster_with_sections(cluster, ("control",))
    control = control_schema(extra.get("control"), str(cluster))  # secrets resolve at `up`
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
    advice = lint_file(err_console, c, cluster, strict, lines, control.advice)
    note = f" ({len(advice)} advice above)" if advice else ""
    console.print(f"[green]ok[/green]: {cluster} is valid{note}")


@app.command()
def demo(
    quiet: Annotated[bool, typer.Option("--quiet", help="only the summaries")] = False,
    fake_gpus: Annotated[
        int | None,
        typer.Option(
            "--fake-gpus",
            metavar="N",
            min=1,
            help="use N fake GPUs even when real ones are present (any number: the acts are "
            "cast for it)",
        ),
    ] = None,
    simulated: Annotated[
        bool,
        typer.Option("--simulated", help="the same story in the simulator (virtual clock)"),
    ] = False,
    keep: Annotated[
        bool,
        typer.Option(
            "--keep",
            help="keep act 2's control plane and its web dashboard up after the demo, until "
            "Ctrl-C or SIGTERM",
        ),
    ] = False,
) -> None:
    """The main job: the control plane on this machine's GPUs, however many (8 fake ones if
    there are none)
    runs the seed's 66-job case and a fenced machine through a serving surge, with real
    processes, then prints what happened and the URL of the web dashboard that showed act 2."""
    if simulated and keep:
        raise typer.BadParameter(
            "--keep keeps the live demo's control plane up; --simulated runs none",
            param_hint="--keep",
        )
    if simulated:
        require("sim", "gpufence demo --simulated")
        from gpufence.cli.demo import run_demo as run_simulated

        ok = run_simulated(console, verbose=not quiet)
    else:
        require("server", "gpufence demo")
        from gpufence.demo.live import run_demo
        from gpufence.testing.fake_nvml import FakeNvml, hgx_h100

        # on fake GPUs, a fake NVML whose counters the demo models: the sampler's path runs
        ok = run_demo(
            console,
            fake=fake_gpus,
            verbose=not quiet,
            fake_nvml=lambda n: FakeNvml(hgx_h100(n)),
            keep=keep,
        )
    if not ok:
        raise typer.Exit(code=1)


# sim's own options, declared apart so that its signature reads as the list of them
_SimWorkloadArg = Annotated[
    Path,
    typer.Argument(metavar="WORKLOAD", help="scenario YAML, or a public trace file (see --format)"),
]
_PolicyOpt = Annotated[
    list[str],
    typer.Option(
        "--policy",
        "-p",
        metavar="POLICY",
        help="single-queue, preempt-on-demand, fenced or fenced-lend; repeat to compare",
    ),
]
_OutOpt = Annotated[Path, typer.Option("--out", metavar="DIR", help="output directory")]
_PlacementOpt = Annotated[
    str | None,
    typer.Option(
        "--placement",
        metavar="NAME",
        help="fractional placement: " + ", ".join(registry.names("placement policy")),
    ),
]
_FormatOpt = Annotated[
    str | None,
    typer.Option(
        "--format",
        metavar="FORMAT",
        help="the trace's format: philly, pai, tiresias, dlrm, openb, azure-llm, sd "
        "(default: a scenario YAML by its .yaml/.yml name, else detected by columns)",
    ),
]
_SimSloOpt = Annotated[
    float | None,
    typer.Option(
        "--slo-p99-ms",
        metavar="MS",
        help="azure-llm / sd traces: the service's p99 SLO (default 10x mean service time)",
    ),
]
_SimSeedsOpt = Annotated[
    str | None,
    typer.Option(
        "--seeds", metavar="SEEDS", help="several seeds (1..5 or 1,3,7): mean and 95 % interval"
    ),
]
_LinkTimelineOpt = Annotated[
    bool, typer.Option("--link-timeline", help="also write OUT/links.csv (per-link series)")
]


@app.command()
def sim(
    cluster: ClusterArg,
    workload: _SimWorkloadArg,
    policy: _PolicyOpt,
    out: _OutOpt = Path("out/sim"),
    seed: SeedOpt = None,
    placement: _PlacementOpt = None,
    strict: StrictOpt = False,
    fmt: _FormatOpt = None,
    slo_p99_ms: _SimSloOpt = None,
    seeds: _SimSeedsOpt = None,
    link_timeline: _LinkTimelineOpt = False,
) -> None:
    """Replay a workload through the scheduler under one or more policies; write
    OUT/metrics.json, OUT/report.html and OUT/events.csv (each policy with its advice)."""
    from gpufence.cli.argcheck import check_cluster_arg, check_workload_arg

    if slo_p99_ms is not None and slo_p99_ms <= 0:
        raise typer.BadParameter("--slo-p99-ms must be > 0")
    require("sim", "gpufence sim")
    check_cluster_arg("sim", cluster, workload)
    check_workload_arg("sim", workload, scenario_only=False)
    from gpufence.cli.sim import parse_seeds, run_sim

    seed_list = parse_seeds(seeds) if seeds is not None else None
    run_sim(
        console,
        cluster,
        workload,
        policy,
        out,
        seed,
        placement,
        strict,
        fmt,
        slo_p99_ms,
        seed_list,
        link_timeline,
    )


@app.command()
def size(
    cluster: ClusterArg,
    workload: Annotated[
        Path, typer.Argument(metavar="SCENARIO", help="scenario YAML with serving services")
    ],
    slo_p99_ms: Annotated[
        float, typer.Option("--slo-p99-ms", metavar="MS", help="serving p99 target (ms)")
    ],
    failure_margin: Annotated[
        int,
        typer.Option("--failure-margin", metavar="K", help="node failures the fence must absorb"),
    ] = 1,
    seed: SeedOpt = None,
    seeds: Annotated[
        str | None,
        typer.Option(
            "--seeds",
            metavar="SEEDS",
            help="validation seeds (1..5 or 1,3,7; default: 3 from the seed)",
        ),
    ] = None,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", metavar="FILE", help="also write the answer as JSON to this file"),
    ] = None,
) -> None:
    """The smallest serving fence meeting the SLO at peak with K failures, and its cost."""
    from gpufence.cli.argcheck import check_cluster_arg, check_workload_arg

    if slo_p99_ms <= 0 or failure_margin < 0:
        raise typer.BadParameter("--slo-p99-ms must be > 0 and --failure-margin >= 0")
    require("sim", "gpufence size")
    check_cluster_arg("size", cluster, workload)
    check_workload_arg("size", workload, scenario_only=True)
    from gpufence.cli.sim import parse_seeds
    from gpufence.sim.inputs import load_inputs
    from gpufence.sim.outputs import write_json
    from gpufence.sim.sizing import size_fence

    seed_list = parse_seeds(seeds) if seeds is not None else None
    sc, c = load_inputs(cluster, workload, seed)
    ans = size_fence(sc, c, slo_p99_ms, failure_margin, seed_list)
    if json_out is not None:
        write_json(json_out, ans.as_dict())
    console.print(
        f"[bold]serving fence: {ans.fence_nodes} nodes = {ans.fence_gpus} GPUs[/bold] "
        f"({ans.replicas_at_peak} replicas at peak + {ans.margin_replicas} GPUs of margin)"
    )
    for line in ans.explanation:
        console.print("  " + line, markup=False, highlight=False, soft_wrap=True)
    from gpufence.cli.speclint import size_advice

    size_advice(console, c, cluster, sc, failure_margin)


register_control_verbs(app)  # up, submit, queue, status, ..., context
app.add_typer(examples_app, name="examples")
app.add_typer(observability_app, name="observability")
app.add_typer(k8s_app, name="k8s")


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
    except ImportError as e:  # an extra's module a verb did not check for: say what to install
        hint = install_hint(e)
        if hint is None:
            raise
        err_console.print(f"error: {hint}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
