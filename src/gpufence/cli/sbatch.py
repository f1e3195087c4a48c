"""``#SBATCH`` lines of a submitted script: the common directives translated, every other refused.

A script written for Slurm asks for its resources in ``#SBATCH`` lines (``--gres=gpu:4``,
``--time=2:00:00``). ``translate`` turns the common ones into the options of ``gpufence submit``
(the table in the README's "#SBATCH scripts"); a directive it cannot translate is refused, each
named with its line, and nothing is submitted: running the script without one would give it
other resources, limits or output files than it asks for -- silently. ``sbatch`` itself refuses
a directive it cannot apply, so refusing is what a Slurm user expects.

Slurm counts some resources per node (``--gres``, ``--mem``) or per job (``--gpus``) where
gpufence counts per gang member (``--ntasks`` members, each a copy of the script, as ``srun``
would start them): a job's GPUs and memory are divided among its tasks, and a count that does
not divide is refused rather than rounded.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufence.cli.sbatch_output import pattern_problem
from gpufence.control.base.arrays import ArraySpecError, parse_array

SBATCH = "#SBATCH"
COMMAND_LINE = 1 << 30
"""The "line" of ``gpufence sbatch``'s own options: after every line of the script, so they win."""
MIB = 1 << 20

LONG = {
    "--gres": "gres",
    "--gpus": "gpus",
    "--ntasks": "ntasks",
    "--cpus-per-task": "cpus-per-task",
    "--mem": "mem",
    "--time": "time",
    "--array": "array",
    "--dependency": "dependency",
    "--job-name": "job-name",
    "--partition": "partition",
    "--output": "output",
    "--error": "error",
    "--nodes": "nodes",
    "--gpus-per-task": "gpus-per-task",
    "--chdir": "chdir",
}
SHORT = {
    "-G": "gpus",
    "-n": "ntasks",
    "-c": "cpus-per-task",
    "-t": "time",
    "-a": "array",
    "-d": "dependency",
    "-J": "job-name",
    "-p": "partition",
    "-o": "output",
    "-e": "error",
    "-N": "nodes",
    "-D": "chdir",
}
DEPENDENCY_KINDS = {"afterok": "after_ok", "afterany": "after_any", "afternotok": "after_not_ok"}
UNLIMITED = frozenset({"unlimited", "infinite", "0"})
_COUNT = re.compile(r"[0-9]{1,6}")
_MIG = re.compile(r"[0-9]+g\.[0-9]+gb")
_MEM = re.compile(r"([0-9]{1,15})([KMGTkmgt]?)")
_MEM_UNITS = {"k": 1 << 10, "": MIB, "m": MIB, "g": 1 << 30, "t": 1 << 40}
_TIME = re.compile(r"(?:([0-9]{1,5})-)?([0-9]{1,7})(?::([0-9]{1,7}))?(?::([0-9]{1,7}))?")


Bad = Callable[[str, str], None]
"""Reports a problem: (directive, what is wrong with its value)."""


class SbatchError(ValueError):
    """Directives that cannot be applied; the message names each with its line."""


@dataclass
class Sbatch:
    """What a script's ``#SBATCH`` lines ask for, as ``gpufence submit`` options."""

    params: dict[str, Any] = field(default_factory=dict)
    """submit's parameter names (``gpus``, ``time_limit``, ...) -> values as the CLI takes them."""
    output: str | None = None
    """``--output``: stdout's file (a pattern: ``%j``, ``%A``, ``%a``, ...), stderr's too unless
    ``error`` names its own."""
    error: str | None = None
    present: bool = False
    """The script has ``#SBATCH`` lines (a Slurm script: named after its file, as sbatch does)."""
    cpu_only: bool = False
    """Its lines ask for no GPU: Slurm gives it none (``finish``), where gpufence's default
    is one."""

    def under(self, params: dict[str, Any], given: Callable[[str], bool]) -> dict[str, Any]:
        """``params`` with these options where the command line (``given``) names none."""
        out = dict(params)
        for key, value in self.params.items():
            if not given(key):
                out[key] = value
        return out

    def finish(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` (every layer applied) with ``--gpus 0`` where the lines ask for no GPU
        and no other layer asks for any (``--gpus``, ``--mig``, ``--gpu-fraction``)."""
        asked = any(params.get(k) is not None for k in ("gpus", "mig", "gpu_fraction"))
        return params if asked or not self.cpu_only else {**params, "gpus": 0}


def sbatch_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text after ``#SBATCH``) of each ``#SBATCH`` line of the top comment block
    (where sbatch reads them: before the first command)."""
    out: list[tuple[int, str]] = []
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith(SBATCH) and (line == SBATCH or line[len(SBATCH)].isspace()):
            out.append((i, line[len(SBATCH) :]))
        elif line and not line.startswith("#"):
            break  # the first command ends the directive block, as sbatch does
    return out


def read_sbatch(script: Path) -> Sbatch:
    """The translation of ``script``'s ``#SBATCH`` lines (empty without any);
    ``SbatchError`` names every line that cannot be applied."""
    try:
        text = script.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return Sbatch()  # not a text script: no directives
    return translate(text, str(script))


def translate(text: str, where: str, options: list[str] | None = None) -> Sbatch:
    """``read_sbatch`` of a script's text (``where``: its path, for messages); ``options``:
    sbatch's command line (``gpufence sbatch``), which wins over the script's lines."""
    problems: list[tuple[int, str]] = []  # (line, what is wrong)
    given: dict[str, tuple[int, str]] = {}  # directive -> (line, value); a later line wins
    lines = sbatch_lines(text)
    if options is not None:
        lines.append((COMMAND_LINE, shlex.join(options)))
    for n, rest in lines:
        try:
            tokens = shlex.split(rest, comments=True)
        except ValueError as exc:
            problems.append((n, f"{rest.strip()}: {exc}"))
            continue
        for key, value, problem in split_options(tokens):
            if problem:
                problems.append((n, problem))
            else:
                given[key] = (n, value)
    out = Sbatch(present=bool(given))
    if given:
        problems += apply(given, out)
    if problems:
        named = "; ".join(f"{place(n)}: {what}" for n, what in sorted(problems, key=lambda p: p[0]))
        raise SbatchError(
            f"{where}: {len(problems)} #SBATCH directive(s) gpufence cannot apply, so nothing "
            f"was submitted: {named}. The README's '#SBATCH scripts' lists those "
            "it translates; remove the others or write what they ask as #GPUFENCE lines"
        )
    return out


def place(line: int) -> str:
    return "the command line" if line == COMMAND_LINE else f"line {line}"


def split_options(tokens: list[str]) -> list[tuple[str, str, str]]:
    """(directive, value, "") per option of one line, or ("", "", problem) for one that is not
    translated; ``--opt=value``, ``--opt value``, ``-o value`` and ``-ovalue`` as sbatch takes."""
    out: list[tuple[str, str, str]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if tok.startswith("--"):
            opt, eq, value = tok.partition("=")
            key = LONG.get(opt)
        elif tok.startswith("-") and len(tok) > 1:
            opt, value, eq = tok[:2], tok[2:], ""
            key = SHORT.get(opt)
        else:
            out.append(("", "", f"{tok}: not an option (a directive is #SBATCH --name=value)"))
            continue
        if key is None:
            while not eq and i < len(tokens) and not tokens[i].startswith("-"):
                tok, i = f"{tok} {tokens[i]}", i + 1  # name its value with it
            out.append(("", "", f"{tok}: not a directive gpufence translates"))
            continue
        if not eq and not value:
            if i >= len(tokens):
                out.append(("", "", f"{opt}: needs a value"))
                continue
            value, i = tokens[i], i + 1
        out.append((key, value, ""))
    return out


def apply(given: dict[str, tuple[int, str]], out: Sbatch) -> list[tuple[int, str]]:
    """Fill ``out`` from the directives; the problems, (line, what is wrong)."""
    problems: list[tuple[int, str]] = []

    def bad(key: str, why: str) -> None:
        line, value = given[key]
        problems.append((line, f"--{key}={value}: {why}"))

    tasks = 1
    if "ntasks" in given:
        tasks = count(given["ntasks"][1])
        if tasks < 1:
            bad("ntasks", "must be a whole number of at least 1")
            tasks = 1
        else:
            out.params["replicas"] = tasks
    if "nodes" in given and given["nodes"][1] not in ("1", "1-1"):
        bad("nodes", "gpufence places a job's tasks itself: give --ntasks (and no --nodes)")
    elif "nodes" in given and tasks > 1:
        bad("nodes", f"gpufence cannot keep {tasks} tasks on one node: drop --nodes=1")
    gpus_of(given, tasks, out, bad)
    simple(given, tasks, out, bad)
    if "dependency" in given:
        for kind, ref, why in dependencies(given["dependency"][1]):
            if why:
                bad("dependency", why)
            else:
                out.params.setdefault(kind, []).append(ref)
    for key in ("output", "error"):
        if key in given:
            wrong = pattern_problem(given[key][1])
            if wrong:
                bad(key, wrong)
            setattr(out, key, given[key][1])
    return problems


def count(text: str) -> int:
    """A whole number of ``text``, -1 when it is none."""
    return int(text) if _COUNT.fullmatch(text) else -1


def gpus_of(given: dict[str, tuple[int, str]], tasks: int, out: Sbatch, bad: Bad) -> None:
    """``--gres=gpu:[TYPE:]N`` / ``--gpus=[TYPE:]N``: the job's GPUs, divided among its tasks
    (``--gpus-per-task=[TYPE:]N``: each task's); a MIG profile as TYPE (``gpu:1g.10gb:1``,
    Slurm's name for a MIG gres) is ``--mig``."""
    asked = [k for k in ("gres", "gpus", "gpus-per-task") if k in given]
    if len(asked) > 1:
        bad(asked[-1], "give the GPUs once: one of --gres=gpu:N, --gpus=N or --gpus-per-task=N")
        return
    if not asked:
        out.cpu_only = True
        return
    key = asked[0]
    value = given[key][1]
    items = value.split(",") if key == "gres" else [f"gpu:{value}"]
    gpu = [i for i in items if i.split(":")[0] == "gpu"]
    if len(gpu) != len(items) or len(gpu) != 1:
        bad(key, "only one gpu:[TYPE:]N is translated (no other generic resources)")
        return
    parts = gpu[0].split(":")[1:] or ["1"]
    total = count(parts[-1])
    if key == "gpus-per-task" and total > 0:
        total *= tasks
    kind = parts[0] if len(parts) == 2 else None
    if len(parts) > 2 or total < 0 or (total == 0 and kind is not None):
        bad(key, "write gpu:N or gpu:TYPE:N with N a whole number (gpu:0: none)")
    elif kind is not None and not _MIG.fullmatch(kind):
        bad(key, f"gpufence picks GPUs by partition, not by type: write gpu:{total} and name "
                 f"the partition that holds {kind} GPUs with --partition")  # fmt: skip
    elif total % tasks:
        bad(key, f"{total} GPU(s) do not divide among {tasks} tasks: give a multiple of {tasks}")
    elif kind is not None and total != tasks:
        bad(key, f"a task holds one MIG instance: give gpu:{kind}:{tasks} for {tasks} task(s)")
    elif kind is not None:
        out.params["mig"] = kind
    else:
        out.params["gpus"] = total // tasks


def simple(given: dict[str, tuple[int, str]], tasks: int, out: Sbatch, bad: Bad) -> None:
    """The directives that map to one submit option each (``CONVERT``)."""
    for key, convert in CONVERT.items():
        if key in given:
            try:
                got = convert(given[key][1], tasks)
            except ValueError as exc:
                bad(key, str(exc))
                continue
            if got is not None:
                out.params[got[0]] = got[1]


def _cpus(value: str, tasks: int) -> tuple[str, Any]:
    if count(value) < 1:
        raise ValueError("must be a whole number of at least 1")
    return "cpus", float(count(value))


def _mem(value: str, tasks: int) -> tuple[str, Any]:
    mem = mem_bytes(value)
    if mem is None:
        raise ValueError("write a size in Slurm's form: 4000 (MB), 500M, 16G or 1T, more than 0")
    return "mem", f"{max(mem // tasks // MIB, 1)}M"  # Slurm's is per node: its tasks' together


def _time(value: str, tasks: int) -> tuple[str, Any] | None:
    seconds = slurm_time(value)
    return ("time_limit", str(seconds)) if seconds else None  # 0: no limit


def _array(value: str, tasks: int) -> tuple[str, Any]:
    try:
        parse_array(value)
    except ArraySpecError as exc:
        raise ValueError(str(exc)) from None
    return "array", value


def _partition(value: str, tasks: int) -> tuple[str, Any]:
    if "," in value:
        raise ValueError("name one partition (gpufence does not try a list in turn)")
    return "partition", value


Convert = Callable[[str, int], "tuple[str, Any] | None"]
CONVERT: dict[str, Convert] = {
    "cpus-per-task": _cpus,
    "mem": _mem,
    "time": _time,
    "array": _array,
    "job-name": lambda value, tasks: ("name", value),
    "partition": _partition,
    "chdir": lambda value, tasks: ("cwd", str(Path(value).absolute())),
}
"""Directive -> (its value, the job's task count) -> (submit option, value), None: no option;
``ValueError`` says what is wrong with the value."""


def mem_bytes(text: str) -> int | None:
    m = _MEM.fullmatch(text.strip())
    if m is None or int(m.group(1)) == 0:
        return None  # --mem=0 (all of a node's memory) has no gpufence equivalent
    return int(m.group(1)) * _MEM_UNITS[m.group(2).lower()]


def slurm_time(text: str) -> int:
    """Seconds of a Slurm time limit (0: none): MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    t = text.strip().lower()
    if t in UNLIMITED:
        return 0
    m = _TIME.fullmatch(t)
    forms = "write MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
    if m is None:
        raise ValueError(f"not a time limit; {forms}")
    day, *rest = m.groups()
    parts = [int(p) for p in rest if p is not None]
    if day is None:  # MM, MM:SS, HH:MM:SS
        hms = [0, parts[0], 0] if len(parts) == 1 else [0, *parts] if len(parts) == 2 else parts
    else:  # D-HH, D-HH:MM, D-HH:MM:SS
        hms = [*parts, 0, 0][:3]
        hms[0] += int(day) * 24
    if any(p >= 60 for p in parts[1:]):  # the first field may be any size (90 = 90 minutes)
        raise ValueError(f"minutes and seconds after a ':' go up to 59; {forms}")
    return (hms[0] * 60 + hms[1]) * 60 + hms[2]


def dependencies(text: str) -> list[tuple[str, str, str]]:
    """(submit option, job, "") per job of ``--dependency`` (``afterok:ID[:ID][,...]``), or
    ("", "", problem) for what is not translated."""
    if "?" in text:
        return [("", "", "'?' (any one of) is not translated: every dependency must hold")]
    out: list[tuple[str, str, str]] = []
    for item in text.split(","):
        kind, _, ids = item.partition(":")
        option = DEPENDENCY_KINDS.get(kind)
        if option is None:
            known = ", ".join(DEPENDENCY_KINDS)
            out.append(("", "", f"'{kind}' dependencies are not translated (only {known})"))
        elif not ids or "" in ids.split(":") or "+" in ids:
            out.append(("", "", f"write {kind}:JOB[:JOB] (no +TIME delay)"))
        else:
            out += [(option, ref, "") for ref in ids.split(":")]
    return out
