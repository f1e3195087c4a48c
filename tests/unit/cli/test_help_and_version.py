"""Every verb's help: no type tags, every option described; --version; shell completion."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gpufence import __version__
from gpufence.cli.main import app

TYPE_TAG = re.compile(r"<(int|float|str|bool|path|list\[[a-z]+\]|[a-z]+)>")


def _commands() -> list[tuple[list[str], object]]:
    """(argv prefix, click command) of every verb and sub-verb."""
    root = typer.main.get_command(app)
    out: list[tuple[list[str], object]] = [([], root)]
    stack: list[tuple[list[str], object]] = [([], root)]
    while stack:
        path, cmd = stack.pop()
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            out.append(([*path, name], sub))
            stack.append(([*path, name], sub))
    return out


COMMANDS = _commands()


@pytest.mark.parametrize(
    "argv", [p for p, _ in COMMANDS], ids=[" ".join(p) or "gpufence" for p, _ in COMMANDS]
)
def test_help_has_no_type_tags(argv: list[str]) -> None:
    r = CliRunner().invoke(app, [*argv, "--help"], env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    assert not TYPE_TAG.search(r.stdout), r.stdout


def test_every_option_and_argument_is_described() -> None:
    missing = []
    for path, cmd in COMMANDS:
        for param in getattr(cmd, "params", []):
            if not getattr(param, "help", None):
                missing.append(f"{' '.join(path)} {param.opts or param.name}")
            is_flag = getattr(param, "is_flag", False) or getattr(param, "count", False)
            if param.param_type_name == "option" and not is_flag and not param.metavar:
                missing.append(f"{' '.join(path)} {param.opts}: no metavar")
    assert not missing, missing


def test_version_is_one_source() -> None:
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.strip() == f"gpufence {__version__}"
    assert importlib.metadata.version("gpufence") == __version__  # pyproject: dynamic version


def test_bash_completion_completes_verbs_and_options() -> None:
    exe = shutil.which("gpufence") or str(Path(sys.executable).parent / "gpufence")
    if not os.path.exists(exe):
        pytest.skip("the gpufence console script is not installed next to this Python")
    base = {**os.environ, "_GPUFENCE_COMPLETE": "complete_bash"}

    def complete(line: str) -> list[str]:
        words = line.split(" ")
        env = {**base, "COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)}
        out = subprocess.run([exe], env=env, capture_output=True, text=True, timeout=30)
        return out.stdout.split()

    assert "queue" in complete("gpufence qu")
    assert "--output" in complete("gpufence queue --out")
    # typer finds the shell among the command's ancestors (shellingham), as when a user types
    # it: run under bash, not under whatever started pytest (a detached job has no shell above
    # it); a second command keeps bash from exec'ing the first in its place
    script = subprocess.run(
        ["bash", "-c", f"'{exe}' --show-completion; exit $?"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert script.returncode == 0 and "_GPUFENCE_COMPLETE" in script.stdout
