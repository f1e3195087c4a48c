"""``gpufence sbatch [OPTIONS] script.sh [ARGS]``: a Slurm batch script submitted as with sbatch.

sbatch's options on the command line (the directives ``#SBATCH`` lines take: ``-p batch``,
``--dependency=afterok:$JID``) win over the script's ``#SBATCH`` lines, as sbatch's do; both
are translated by ``sbatch.py`` and anything else is refused whole. It prints what sbatch
prints (``Submitted batch job j5``; ``--parsable``: the id alone, for ``JID=$(gpufence sbatch
--parsable a.sh)``). A script with ``#GPUFENCE`` lines is for ``gpufence submit``, which reads
both kinds; here it is refused rather than run with those lines ignored.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufence.cli.connect import (
    ContextOpt,
    DataOpt,
    TokenOpt,
    UrlOpt,
    client_errors,
    client_for,
    fail,
)
from gpufence.cli.jobfile import DIRECTIVE, read_directives, script_command
from gpufence.cli.render import err_console
from gpufence.cli.sbatch import LONG, SHORT, SbatchError, translate
from gpufence.cli.sbatch_output import with_output
from gpufence.cli.submit_body import build_body
from gpufence.cli.submit_verb import array_line, is_script
from gpufence.spec import SpecError

CONTEXT = {
    "allow_extra_args": True,
    "ignore_unknown_options": True,
    "allow_interspersed_args": False,
}
USAGE = "[OPTIONS] [SBATCH OPTIONS] SCRIPT [ARGS]..."
OWN_OPTIONS = frozenset({"--parsable", "--url", "--token", "--data", "--context"})


def split_command_line(args: list[str]) -> tuple[list[str], Path, list[str]]:
    """(sbatch's options, the script, its arguments) of ``gpufence sbatch``'s arguments: the
    script is the first word that is not an option or an option's value."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        i += 2 if takes_next(args[i], args[i + 1 :]) else 1
    ours = [a for a in args[:i] if a.partition("=")[0] in OWN_OPTIONS]
    if ours:
        raise fail(f"put {ours[0].partition('=')[0]} first, before sbatch's options")
    if i >= len(args):
        raise fail("give the batch script to submit: gpufence sbatch [OPTIONS] script.sh [ARGS]")
    return args[:i], Path(args[i]), args[i + 1 :]


def takes_next(option: str, rest: list[str]) -> bool:
    """Whether ``option``'s value is the next word: a translated one without ``=value``; one
    that is not translated (refused later, named with its value) when that word is no script."""
    if option in LONG or option in SHORT:
        return True
    known = option.partition("=")[0] in LONG or option[:2] in SHORT
    if known or "=" in option or not rest or rest[0].startswith("-"):
        return False
    return not is_script(Path(rest[0]))


def sbatch(
    ctx: typer.Context,
    parsable: Annotated[
        bool, typer.Option("--parsable", help="print the job's id alone (sbatch's --parsable)")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Submit a Slurm batch script: sbatch's options (README '#SBATCH scripts'), the script,
    its arguments. The options win over its #SBATCH lines; an untranslated one is refused.
    gpufence's own options (below) go first."""
    options, script, args = split_command_line(list(ctx.args))
    if not is_script(script):
        raise fail(f"no such script: {script} (gpufence sbatch runs a batch script)")
    try:
        gpufence_lines = bool(read_directives(script))
    except SpecError:
        gpufence_lines = True
    if gpufence_lines:
        raise fail(f"{script} has {DIRECTIVE} lines: submit it with gpufence submit")
    try:
        sb = translate(script.read_text(encoding="utf-8"), str(script), options)
    except SbatchError as exc:
        raise fail(str(exc)) from None
    params: defaultdict[str, Any] = defaultdict(lambda: None, sb.finish(sb.params))
    gang = (params["replicas"] or 1) > 1
    params["command"] = with_output([*script_command(script), *args], sb.output, sb.error, gang)
    params["env"] = [f"SLURM_JOB_NAME={script.name}"]
    body = build_body(params)
    client = client_for(url, token, data, context)
    with client_errors():
        res = client.submit(body)
    typer.echo(res["id"] if parsable else f"Submitted batch job {res['id']}")
    tasks = [str(t) for t in res.get("tasks") or []]
    if tasks and not parsable:
        err_console().print(array_line(str(res["id"]), tasks, body.get("array")), markup=False)
