"""How ``--help`` looks: no type tags (``<int>``, ``<bool>``, ``<list[str]>``), only metavars.

Recent typer releases print each parameter's Python type in a column of its own. For a flag that
says nothing (``--checkpointable <bool>``), and for an option it is less useful than a metavar
that says what to type (``--gpus N``, ``--mem SIZE``). ``use_metavars()`` makes that column show
the option's metavar, and nothing for flags and positional arguments (their name column already
shows the metavar). Every value option of the CLI sets one; tests/unit/cli/test_help.py walks
every verb's help to check that no type tag is left and that every option is described.

On a typer without the column (older releases print click's metavar) this changes nothing.
"""

from __future__ import annotations

from typing import Any

import typer.core


def _metavar_only(self: Any, ctx: Any) -> str | None:
    if getattr(self, "is_flag", False) or getattr(self, "count", False):
        return None
    if getattr(self, "param_type_name", "") == "argument":
        return None
    metavar = getattr(self, "metavar", None)
    return str(metavar) if metavar else None


def use_metavars() -> None:
    """Patch typer's help rendering once (idempotent)."""
    for cls_name in ("TyperOption", "TyperArgument"):
        cls = getattr(typer.core, cls_name, None)
        if cls is not None and hasattr(cls, "display_type_rich"):
            cls.display_type_rich = _metavar_only
