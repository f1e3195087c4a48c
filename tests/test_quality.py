"""Lint and type checks run as part of the suite, so CI enforces them with the tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_clean() -> None:
    r = _run(sys.executable, "-m", "ruff", "check", "src", "tests", "bench")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict_clean_on_the_package() -> None:
    r = _run(sys.executable, "-m", "mypy", "src/gpufence")
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_contracts_kept() -> None:
    """The layer and pure-core contracts of pyproject.toml's [tool.importlinter] (lint-imports)."""
    r = _run(
        sys.executable,
        "-c",
        "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())",
        "--no-cache",
    )
    assert r.returncode == 0, r.stdout + r.stderr
