"""``gpufence observability list|path|copy``: the Grafana dashboard and the Prometheus rules
shipped in the package (``gpufence/observability``), for a Grafana import and Prometheus'
``rule_files``:

* ``grafana-dashboard.json`` - fences, queues, serving p99 vs SLO, GPU and link load, incidents
  (a ``datasource`` variable picks the Prometheus);
* ``prometheus-rules.yaml`` - recording rules (SLO burn ratios, queue delay p95, the DCGM join
  ``gpufence:gpu_allocated:by_UUID``) and alerts (serving SLO burn, fence saturation, queue
  delay p95, preemption budget spent, GPU held at 0 %, stranded fragments, node down);
* ``prometheus-rules-test.yaml`` - their ``promtool test rules`` cases.

``observability list -o json``: ``{"dir": PATH, "files": [{"name", "path", "about"}]}``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufence.cli.output import Frame, OutputOpt, check_format, show
from gpufence.cli.packaged import copy_files, find_file
from gpufence.cli.render import Col, build_table

observability_app = typer.Typer(
    help="The Grafana dashboard and Prometheus rules shipped with gpufence.",
    no_args_is_help=True,
)
_ABOUT = {
    "grafana-dashboard.json": "Grafana dashboard: fences, queues, serving p99 vs SLO, GPUs, links",
    "prometheus-rules.yaml": "Prometheus recording and alerting rules",
    "prometheus-rules-test.yaml": "promtool test rules cases for the rules",
}


def observability_dir() -> Path:
    return Path(str(resources.files("gpufence") / "observability"))


def _files() -> list[Path]:
    return sorted(p for p in observability_dir().iterdir() if p.name in _ABOUT)


def _doc() -> dict[str, Any]:
    files = [{"name": p.name, "path": str(p), "about": _ABOUT[p.name]} for p in _files()]
    return {"dir": str(observability_dir()), "files": files}


@observability_app.command("list")
def list_files(output: OutputOpt = "table") -> None:
    """The files: name and what each is."""
    fmt = check_format(output)
    doc = _doc()
    rows = [[f["name"], f["about"]] for f in doc["files"]]
    cols = (Col("name"), Col("about", flex=True))
    show(Frame(doc, lambda wide: build_table(cols, rows, wide, title=doc["dir"])), fmt)


@observability_app.command("path")
def path(
    name: Annotated[
        str | None,
        typer.Argument(metavar="NAME", help="a file's name [default: the directory]"),
    ] = None,
) -> None:
    """Print the path of a file (or of the directory), for $(...) in a shell."""
    if name is None:
        typer.echo(str(observability_dir()))
        return
    typer.echo(str(find_file(_files(), name, "file")))


@observability_app.command("copy")
def copy(
    dest: Annotated[Path, typer.Argument(metavar="DIR", help="directory to copy them into")],
    force: Annotated[bool, typer.Option("--force", help="overwrite files already there")] = False,
) -> None:
    """Copy the dashboard and the rules into DIR (to edit thresholds, or to mount them)."""
    copy_files(_files(), dest, force, "files")
