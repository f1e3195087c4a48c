"""``#SBATCH --output`` / ``--error``: the script's stdout and stderr to files named by pattern.

The file's name holds the job's id (``%j``), the array's (``%A``) and the task's index (``%a``),
known only once the job runs; so the script runs under a small ``/bin/sh`` wrapper that expands
the pattern from the ``SLURM_*`` variables every job gets (``control/base/slurmenv.py``) and
redirects before it ``exec``s the script (same process, same exit code, same signals). The file
is relative to the job's working directory, as sbatch's is to its. The job's own log
(``gpufence logs``) then holds only what the wrapper itself says (a file it cannot open), and
its log cap does not apply to the file, which is the user's.

Patterns: ``%j`` job id, ``%A`` the array's id (a job outside an array: its own id), ``%a`` the
task's index (outside an array: 4294967294, Slurm's), ``%x`` the job's name, ``%t`` the task's
rank in its gang (SLURM_PROCID), ``%%`` a ``%``. Any other ``%`` is refused at submit.
"""

from __future__ import annotations

import re

LETTERS = frozenset("jAaxt")
_PERCENT = re.compile(r"%(.?)")

# POSIX sh: expand the pattern one '%' at a time (sh has no ${x//a/b}), then redirect and exec.
WRAPPER = r"""expand() {
  rest=$1 out=
  while :; do
    case $rest in *%*) ;; *) break ;; esac
    out=$out${rest%%"%"*}
    rest=${rest#*"%"}
    c=${rest%"${rest#?}"}
    rest=${rest#?}
    case $c in
      j) out=$out$SLURM_JOB_ID ;;
      A) out=$out${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID} ;;
      a) out=$out${SLURM_ARRAY_TASK_ID:-4294967294} ;;
      x) out=$out$SLURM_JOB_NAME ;;
      t) out=$out$SLURM_PROCID ;;
      %) out=$out% ;;
    esac
  done
  printf '%s' "$out$rest"
}
o=$1 e=$2 mode=$3
shift 3
if [ -n "$o" ]; then
  o=$(expand "$o")
  if [ "$mode" = append ]; then exec >>"$o"; else exec >"$o"; fi
  [ -n "$e" ] || exec 2>&1
fi
if [ -n "$e" ]; then
  e=$(expand "$e")
  if [ "$mode" = append ]; then exec 2>>"$e"; else exec 2>"$e"; fi
fi
exec "$@"
"""


def pattern_problem(pattern: str) -> str | None:
    """What is wrong with an ``--output``/``--error`` pattern (None: nothing)."""
    if not pattern:
        return "name a file (e.g. %x-%j.out)"
    for m in _PERCENT.finditer(pattern.replace("%%", "")):
        if m.group(1) not in LETTERS:
            shown = "%" + m.group(1)
            return f"{shown!r} is not translated (use %j, %A, %a, %x, %t or %%)"
    return None


def with_output(command: list[str], output: str | None, error: str | None, gang: bool) -> list[str]:
    """``command`` run with its stdout (and stderr) sent to the pattern's files; unchanged
    without either. A gang's members share the files: each appends, none truncates another's."""
    if output is None and error is None:
        return command
    mode = "append" if gang else "truncate"
    return ["/bin/sh", "-c", WRAPPER, "gpufence-sbatch", output or "", error or "", mode, *command]


def shown_command(command: list[str]) -> str:
    """``command`` as ``status`` and ``queue`` show it: a wrapped script as the script with its
    redirections (``sweep.sh > %A_%a.out``), not the wrapper's lines."""
    if len(command) < 7 or command[:4] != ["/bin/sh", "-c", WRAPPER, "gpufence-sbatch"]:
        return " ".join(command)
    out, err, _, *rest = command[4:]
    shown = " ".join(rest)
    if out:
        shown += f" > {out}" + ("" if err else " 2>&1")
    return shown + (f" 2> {err}" if err else "")
