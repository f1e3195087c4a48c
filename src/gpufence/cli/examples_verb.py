"""``gpufence examples list|path|copy``: the cluster specs and scenarios shipped in the package.

They live in ``gpufence/examples`` inside the installed package (``examples/`` at the root of a
clone is a link to ``src/gpufence/examples``), so a README command such as
``gpufence sim examples/mixed-64.yaml examples/scenario-mixed-64.yaml ...`` works anywhere after
``gpufence examples copy examples``, or with ``$(gpufence examples path mixed-64.yaml)``.

``examples list -o json``: ``{"dir": PATH, "examples": [{"name", "kind", "path", "about"}]}``
(``kind``: cluster, scenario, or job for a job file; ``about``: the file's first comment line).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufence.cli.output import Frame, OutputOpt, check_format, show
from gpufence.cli.packaged import copy_files, find_file
from gpufence.cli.render import Col, build_table

examples_app = typer.Typer(
    help="The example cluster specs and scenarios shipped with gpufence.", no_args_is_help=True
)


def examples_dir() -> Path:
    """The installed package's examples directory (a real directory: setuptools installs
    package data as files)."""
    return Path(str(resources.files("gpufence") / "examples"))


def _files() -> list[Path]:
    return sorted(p for p in examples_dir().iterdir() if p.suffix in (".yaml", ".yml"))


def _about(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").rstrip()
        if line.strip():
            break
    return ""


def _kind(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    if "\napiVersion: gpufence/v1" in text:
        return "job"  # a job file: gpufence submit -f
    return "scenario" if "\nhorizon_s:" in text else "cluster"


def _doc() -> dict[str, Any]:
    items = [
        {"name": p.name, "kind": _kind(p), "path": str(p), "about": _about(p)} for p in _files()
    ]
    return {"dir": str(examples_dir()), "examples": items}


@examples_app.command("list")
def list_examples(output: OutputOpt = "table") -> None:
    """The examples: name, kind (cluster, scenario or job file), what each is."""
    fmt = check_format(output)
    doc = _doc()
    rows = [[e["name"], e["kind"], e["about"]] for e in doc["examples"]]
    cols = (Col("name"), Col("kind"), Col("about", flex=True))
    show(Frame(doc, lambda wide: build_table(cols, rows, wide, title=doc["dir"])), fmt)


@examples_app.command("path")
def path(
    name: Annotated[
        str | None,
        typer.Argument(metavar="NAME", help="an example's file name [default: the directory]"),
    ] = None,
) -> None:
    """Print the path of an example (or of the examples directory), for $(...) in a shell."""
    if name is None:
        typer.echo(str(examples_dir()))
        return
    typer.echo(str(find_file(_files(), name, "example")))


@examples_app.command("copy")
def copy(
    dest: Annotated[
        Path, typer.Argument(metavar="DIR", help="directory to copy them into (created)")
    ],
    force: Annotated[
        bool, typer.Option("--force", help="overwrite files that already exist there")
    ] = False,
) -> None:
    """Copy every example into DIR, so the README's `examples/...` commands work there."""
    copy_files(_files(), dest, force, "examples")
