"""``#SBATCH`` lines in a submitted script: refused, each named, until they are translated.

A script written for Slurm asks for its resources in ``#SBATCH`` lines (``--gres=gpu:4``,
``--time=2:00:00``). gpufence reads only ``#GPUFENCE`` lines today, and running such a script
with none of its ``#SBATCH`` lines applied would run it with the wrong GPUs, no time limit and
its output elsewhere -- silently. ``sbatch`` itself refuses a script whose directives it cannot
apply (``sbatch: error: invalid directive``), so refusing is what a Slurm user expects, and it
costs them a rename (``#SBATCH --gres=gpu:4`` -> ``#GPUFENCE --gpus 4``) rather than a wasted run.

``unapplied_sbatch_lines`` is this whole policy: the translation of the common directives
(issue 32's ``#SBATCH`` compatibility) replaces it.
"""

from __future__ import annotations

from pathlib import Path

SBATCH = "#SBATCH"
SHOWN = 10


def sbatch_lines(script: Path) -> list[tuple[int, str]]:
    """(line number, text) of each ``#SBATCH`` line of the script's top comment block (where
    sbatch reads them: before the first command)."""
    try:
        text = script.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    out: list[tuple[int, str]] = []
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith(SBATCH) and (line == SBATCH or line[len(SBATCH)].isspace()):
            out.append((i, line))
        elif line and not line.startswith("#"):
            break  # the first command ends the directive block, as sbatch does
    return out


def unapplied_sbatch_lines(script: Path) -> str | None:
    """The refusal for a script with ``#SBATCH`` lines (None: it has none), naming each."""
    lines = sbatch_lines(script)
    if not lines:
        return None
    named = "; ".join(f"{script}:{n}: {text}" for n, text in lines[:SHOWN])
    more = f" (and {len(lines) - SHOWN} more)" if len(lines) > SHOWN else ""
    return (
        f"{len(lines)} #SBATCH line(s) that gpufence does not apply yet: {named}{more}. Running "
        "the script without them would give it other resources than it asks for; write them "
        "as #GPUFENCE lines (#SBATCH --gres=gpu:4 --time=1:00:00 -> #GPUFENCE --gpus 4 "
        "--time-limit 1h) or remove them"
    )
