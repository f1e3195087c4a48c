"""``gpufence submit``: a command, a script with ``#GPUFENCE`` directives, or a job file.

* ``gpufence submit [OPTIONS] -- CMD ...`` submits CMD;
* ``gpufence submit [OPTIONS] script.sh`` runs the script (through its ``#!`` line) with the
  options of its ``#GPUFENCE`` lines (``jobfile.py``) over those its ``#SBATCH`` lines translate
  to (``sbatch.py``); options on the command line win over both;
* ``gpufence submit -f jobs.yaml`` submits every document of a job file, all checked first.

``--array`` makes one job per index, ``--after-ok/--after-any/--after-not-ok`` chain jobs (ids
or names), ``--hold`` submits on hold, ``--wait`` waits for the end and exits with the job's
code (``jobrefs.WAIT_CODES``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import typer
from typer._click.core import ParameterSource  # typer's own click (it vendors one)
from typer._click.exceptions import ClickException

from gpufence.cli import submit_options as opts
from gpufence.cli.connect import (
    ContextOpt,
    DataOpt,
    TokenOpt,
    UrlOpt,
    client_errors,
    client_for,
    fail,
)
from gpufence.cli.failure import failure_line
from gpufence.cli.job_verbs import last_err_line
from gpufence.cli.jobfile import DIRECTIVE, load_job_file, read_directives, script_command
from gpufence.cli.jobrefs import wait_exit, wait_for
from gpufence.cli.render import err_console
from gpufence.cli.sbatch import SbatchError, read_sbatch
from gpufence.cli.sbatch_output import with_output
from gpufence.cli.submit_body import build_body
from gpufence.control.base.arrays import ArraySpecError, parse_array
from gpufence.control.http.client import (
    IDEMPOTENCY_KEY_PATTERN,
    SUBMIT_PATIENCE_S,
    Client,
    ClientError,
)
from gpufence.spec import SpecError, format_spec_error

NOT_IN_DIRECTIVES = ("file", "url", "token", "data", "context", "wait")


def submit(
    ctx: typer.Context,
    command: opts.CommandArg = None,
    file: opts.FileOpt = None,
    gpus: opts.GpusOpt = None,
    mig: opts.MigOpt = None,
    gpu_fraction: opts.GpuFractionOpt = None,
    gpu_mem: opts.GpuMemOpt = None,
    replicas: opts.ReplicasOpt = None,
    instances: opts.InstancesOpt = None,
    partition: opts.PartitionOpt = None,
    queue: opts.QueueOpt = None,
    priority: opts.PriorityOpt = None,
    checkpointable: opts.CheckpointableOpt = False,
    est_runtime: opts.EstRuntimeOpt = None,
    cpus: opts.CpusOpt = None,
    mem: opts.MemOpt = None,
    log_limit: opts.LogLimitOpt = None,
    time_limit: opts.TimeLimitOpt = None,
    slo_p99_ms: opts.SloP99MsOpt = None,
    metrics_url: opts.MetricsUrlOpt = None,
    metrics_port: opts.MetricsPortOpt = None,
    latency_metric: opts.LatencyMetricOpt = None,
    env: opts.EnvOpt = None,
    workload_class: opts.WorkloadClassOpt = None,
    name: opts.NameOpt = None,
    max_attempts: opts.MaxAttemptsOpt = None,
    cwd: opts.CwdOpt = None,
    container: opts.ContainerOpt = None,
    tenant: opts.TenantOpt = None,
    array: opts.ArrayOpt = None,
    after_ok: opts.AfterOkOpt = None,
    after_any: opts.AfterAnyOpt = None,
    after_not_ok: opts.AfterNotOkOpt = None,
    hold: opts.HoldOpt = False,
    wait: opts.WaitOpt = False,
    idempotency_key: opts.IdempotencyKeyOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Submit a job (a command, a script with #GPUFENCE lines, or -f a job file); prints its id
    (an array: the array's id, its first task's). A job that can never run is rejected: exit 1."""
    params = dict(ctx.params)
    client = client_for(url, token, data, context)
    if file is not None:
        if command:
            raise fail("give either -f JOBS.yaml or a command, not both")
        given = [p for p in params if p not in ("file", "wait", "url", "token", "data", "context")
                 and ctx.get_parameter_source(p) is ParameterSource.COMMANDLINE]  # fmt: skip
        if given:
            flags = ", ".join("--" + p.replace("_", "-") for p in given)
            raise fail(f"-f takes every field from the job file; drop {flags} or put it there")
        submit_file(client, file, wait)
        return
    if not command:
        raise fail("give the command after --, a script, or -f JOBS.yaml")
    if is_script(Path(command[0])):  # its #GPUFENCE lines count with arguments too (sbatch)
        script = Path(command[0])
        params = with_sbatch(ctx, script, params, command[1:])
    elif len(command) == 1 and _looks_like_a_path(command[0]) and not Path(command[0]).exists():
        raise fail(
            f"no such script: {command[0]} (a command found on the job's PATH has no '/'; "
            "check the path)"
        )
    if idempotency_key is not None and not IDEMPOTENCY_KEY_PATTERN.fullmatch(idempotency_key):
        raise typer.BadParameter(
            "must be 1-255 visible ASCII characters (no spaces)", param_hint="--idempotency-key"
        )
    body = build_body(params)
    if params["instances"] is not None:
        ids = submit_instances(client, body, params["instances"], idempotency_key)
    else:
        ids = submit_one(client, body, idempotency_key)
    if wait:
        raise typer.Exit(end_of_wait(client, wait_for(client, ids)))


SHOWN_FAILURES = 5
"""How many failed jobs ``--wait`` describes (an array's other failures are counted)."""


def end_of_wait(client: Client, jobs: list[dict[str, Any]]) -> int:
    """``--wait``'s exit code; first, on stderr, how each job that ended badly ended (its exit
    and the last line its failing member wrote to stderr, as ``status`` says it): the id alone
    sent the user to ``status`` and ``logs`` for what ``--wait`` already knew (issue 32)."""
    bad = [j for j in jobs if failure_line(j) is not None]
    for j in bad[:SHOWN_FAILURES]:
        err = None
        if j.get("state") == "failed" and (j.get("exit_code") or 0) > 0:
            with contextlib.suppress(ClientError):  # the exit code stands without its stderr
                err = last_err_line(client, j)
        err_console().print(f"{j['id']}: {failure_line(j, err)}", markup=False, soft_wrap=True)
    if len(bad) > SHOWN_FAILURES:
        err_console().print(
            f"... and {len(bad) - SHOWN_FAILURES} more that ended badly (gpufence queue --all)",
            markup=False,
        )
    return wait_exit(jobs)


def is_script(path: Path) -> bool:
    """A text file here (``#!`` first, or no NUL in its head): run through its interpreter,
    its ``#GPUFENCE`` lines read. A binary (``/usr/bin/python3 train.py``) runs as given."""
    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
    except OSError:  # not a file here (a command on the job's PATH), or unreadable
        return False
    return head.startswith(b"#!") or (bool(head) and b"\0" not in head)


def _looks_like_a_path(arg: str) -> bool:
    return "/" in arg or arg.endswith((".sh", ".py", ".bash"))


def with_sbatch(
    ctx: typer.Context, script: Path, params: dict[str, Any], args: list[str]
) -> dict[str, Any]:
    """``params`` for ``script`` run with ``args``: its ``#SBATCH`` lines translated
    (``sbatch.py``), under its ``#GPUFENCE`` lines, under the command line."""
    try:
        sb = read_sbatch(script)
    except SbatchError as exc:
        raise fail(str(exc)) from None
    out = sb.under(params, lambda p: ctx.get_parameter_source(p) is ParameterSource.COMMANDLINE)
    out = sb.finish(with_directives(ctx, script, out))
    gang = (out["replicas"] or 1) > 1
    out["command"] = with_output([*script_command(script), *args], sb.output, sb.error, gang)
    if sb.present:  # SLURM_JOB_NAME without --job-name: the script's file name, as sbatch's
        out["env"] = [f"SLURM_JOB_NAME={script.name}", *(out["env"] or [])]
    return out


def with_directives(ctx: typer.Context, script: Path, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with the script's ``#GPUFENCE`` options under those of the command line."""
    try:
        directives = read_directives(script)
    except SpecError as exc:
        raise fail(format_spec_error(exc).removeprefix("error: ")) from None
    out = dict(params)
    for line, args in directives:
        try:  # one line at a time, so that an error names its line
            sub = ctx.command.make_context(ctx.info_name, [*args, "--", "x"], parent=ctx.parent)
        except ClickException as exc:
            msg = f"{script}:{line}: {DIRECTIVE} {' '.join(args)}: {exc.format_message()}"
            raise fail(msg) from None
        for name, value in sub.params.items():
            if (
                name == "command"
                or sub.get_parameter_source(name) is not ParameterSource.COMMANDLINE
            ):
                continue
            if name in NOT_IN_DIRECTIVES:
                raise fail(f"{script}:{line}: --{name.replace('_', '-')} is not for a directive")
            if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
                continue  # the command line wins
            if name == "env":  # repeatable: every directive's variables add up
                out[name] = [*(out.get(name) or []), *value]
            else:
                out[name] = value
    return out


def submit_one(client: Client, body: dict[str, Any], key: str | None = None) -> list[str]:
    """Submit; print the id (and, for an array, its tasks on stderr). Every job's id."""
    told: list[bool] = []

    def retrying(exc: ClientError) -> None:
        if not told:  # once: the user should know why it waits, not see every try
            told.append(True)
            err_console().print(
                f"no answer from {client.url} (the job may have reached it): trying again with "
                f"the same Idempotency-Key for up to {SUBMIT_PATIENCE_S:.0f} s (a second job is "
                "never made)",
                markup=False,
                soft_wrap=True,
            )

    with client_errors():
        res = client.submit(body, key, on_retry=retrying)
    typer.echo(res["id"])
    tasks = [str(t) for t in res.get("tasks") or []]
    if tasks:
        err_console().print(array_line(str(res["id"]), tasks, body.get("array")), markup=False)
    if res.get("state") == "pending" and res.get("reason"):
        err_console().print(f"pending ({res['reason']}): {res.get('message', '')}", markup=False)
    return tasks or [str(res["id"])]


def array_line(array: str, tasks: list[str], spec: object) -> str:
    """``array j4: 6 task(s) j4_0..j4_5 (jobs j5..j10)``: the array's id (which dependencies,
    cancel, hold, release and status take for every task) and its tasks, each also a job."""
    try:
        indices = parse_array(str(spec))[0] if spec is not None else ()
    except ArraySpecError:
        indices = ()
    head = f"array {array}: {len(tasks)} task(s)"
    if array == tasks[0] or len(indices) != len(tasks):  # a server that gives arrays no id
        return f"{head}, {tasks[0]}..{tasks[-1]}"
    return f"{head} {array}_{indices[0]}..{array}_{indices[-1]} (jobs {tasks[0]}..{tasks[-1]})"


def submit_instances(client: Client, body: dict[str, Any], n: int, key: str | None) -> list[str]:
    """``--instances N``: a serving deployment of N replicas, each a job of its own sharing the
    deployment's name (what ``gpufence_serving_replicas`` counts); all or none: if the server
    refuses one, those already submitted are cancelled again. With ``--idempotency-key K`` the
    instances are keyed ``K.1`` .. ``K.N``, so a retried command makes no second deployment."""
    if body.get("class") != "serving":
        raise fail("--instances makes a serving deployment: give --class serving (the members "
                   "of one gang job are --replicas)")  # fmt: skip
    if n > 1 and "name" not in body:
        raise fail(f"--instances {n}: the replicas of a deployment share its name; give --name")
    if "array" in body:
        raise fail("give either --instances or --array, not both")
    done: list[str] = []
    for i in range(1, n + 1):
        try:
            res = client.submit(body, None if key is None else f"{key}.{i}")
        except ClientError as exc:
            for jid in done:
                with contextlib.suppress(ClientError):
                    client.cancel(jid)
            undone = f"; cancelled again: {', '.join(done)}" if done else ""
            raise fail(f"instance {i} of {n}: {exc}{undone}", 2 if exc.bad_input else 1) from None
        done.append(str(res["id"]))
        typer.echo(res["id"])
    return done


def submit_file(client: Client, path: Path, wait: bool) -> None:
    """Every job of the file, or none: all documents are checked first; if the server refuses
    one (a name in use, an unknown dependency, a job no partition can hold), the jobs of the
    file already submitted are cancelled again and the command fails."""
    try:
        docs = load_job_file(path, os.getcwd())
    except SpecError as exc:
        err_console().print(format_spec_error(exc), markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    done: list[str] = []
    for doc in docs:
        try:
            done += submit_quiet(client, doc.body)
        except ClientError as exc:
            for jid in done:
                with contextlib.suppress(ClientError):
                    client.cancel(jid)
            undone = f"; cancelled again: {', '.join(done)}" if done else ""
            raise fail(f"{path}:{doc.line}: {exc}{undone}", 2 if exc.bad_input else 1) from None
    for jid in done:
        typer.echo(jid)
    if wait:
        raise typer.Exit(end_of_wait(client, wait_for(client, done)))


def submit_quiet(client: Client, body: dict[str, Any]) -> list[str]:
    res = client.submit(body)
    return [str(t) for t in res.get("tasks") or []] or [str(res["id"])]
