"""Spec advice in the CLI: ``validate``, ``up`` and ``sim`` run the spec rules on the cluster
file and print what they find as warnings (rule id, file:line, field path, why, fix, diff);
``--strict`` makes the warnings errors (exit code 2).

The rules themselves are pure (``gpufence.advice``); this module only reads the file's queue
positions (so a path says ``queues[1]``, not a name) and prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from gpufence.advice.inputs import AdviceSettings, LintInputs
from gpufence.advice.lint import lint_cluster
from gpufence.advice.present import count_line, failing, text_block
from gpufence.advice.record import Advice
from gpufence.model.cluster import Cluster
from gpufence.spec.errors import Path as FieldPath
from gpufence.spec.positions import queue_positions

if TYPE_CHECKING:
    from gpufence.sim.scenario import Scenario

STRICT_EXIT = 2  # like any other spec error: bad input


def file_inputs(
    path: Path,
    lines: Mapping[FieldPath, int] | None = None,
    settings: AdviceSettings | None = None,
    base: LintInputs | None = None,
) -> LintInputs:
    cfg = settings or AdviceSettings()
    return replace(
        base or LintInputs(),
        queue_index=queue_positions(path),
        lines=dict(lines or {}),
        failure_margin_nodes=cfg.failure_margin_nodes,
        ignore=tuple(cfg.ignore),
    )


def report(console: Console, advice: Sequence[Advice], source: str | None, strict: bool) -> None:
    """Print the advice; with ``strict`` and any warning, end the command with exit code 2."""
    if not advice:
        return
    console.print(text_block(advice, source, strict), markup=False, highlight=False, soft_wrap=True)
    console.print(count_line(advice, strict), markup=False, highlight=False)
    if strict and failing(advice):
        raise typer.Exit(STRICT_EXIT)


def lint_file(
    console: Console,
    cluster: Cluster,
    path: Path,
    strict: bool,
    lines: Mapping[FieldPath, int] | None = None,
    settings: AdviceSettings | None = None,
    base: LintInputs | None = None,
) -> list[Advice]:
    """Lint ``cluster`` (read from ``path``), print, and exit 2 if strict and warned."""
    advice = lint_cluster(cluster, file_inputs(path, lines, settings, base))
    report(console, advice, str(path), strict)
    return advice


def size_advice(
    console: Console, cluster: Cluster, path: Path, sc: Scenario, failure_margin: int
) -> None:
    """``gpufence size`` closes with the spec advice on the cluster as it is, given the
    scenario's peak and the failure margin asked for."""
    from gpufence.sim.advice_run import scenario_inputs

    base = replace(scenario_inputs(sc, cluster), failure_margin_nodes=failure_margin)
    inputs = replace(file_inputs(path, base=base), failure_margin_nodes=failure_margin)
    found = lint_cluster(cluster, inputs)
    if not found:
        console.print("advice on the cluster as it is: none", markup=False)
        return
    console.print("advice on the cluster as it is:", markup=False)
    console.print(text_block(found, str(path)), markup=False, highlight=False, soft_wrap=True)
