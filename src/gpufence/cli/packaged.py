"""Files shipped inside the package (examples, observability assets): find one by name, copy
them all. Shared by ``gpufence examples`` and ``gpufence observability``."""

from __future__ import annotations

import shutil
from pathlib import Path

import typer

from gpufence.cli.connect import fail


def find_file(files: list[Path], name: str, what: str) -> Path:
    """The file called ``name`` (with or without its suffix); exit 2 naming the known ones."""
    for p in files:
        if name in (p.name, p.stem):
            return p
    raise fail(f"no {what} '{name}' (known: {', '.join(p.name for p in files)})")


def copy_files(files: list[Path], dest: Path, force: bool, what: str) -> None:
    """Copy ``files`` into ``dest`` (created); never over existing files unless ``force``."""
    if dest.exists() and not dest.is_dir():
        raise fail(f"{dest} exists and is not a directory")
    clash = [p.name for p in files if (dest / p.name).exists()]
    if clash and not force:
        raise fail(f"{dest} already has {', '.join(clash)}: pass --force to overwrite")
    dest.mkdir(parents=True, exist_ok=True)
    for p in files:
        shutil.copyfile(p, dest / p.name)
    typer.echo(f"copied {len(files)} {what} to {dest}")
