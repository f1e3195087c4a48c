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
from typing import Annotated, Any

import typer
from typer._click.core import ParameterSource  # typer's own click (it vendors one)
from typer._click.exceptions import ClickException

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
from gpufence.cli.jobrefs import WAIT_CODES, wait_exit, wait_for
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
    command: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="CMD",
            help="the command to run, after --: -- python train.py --lr 3e-4; or one script "
            f"whose '{DIRECTIVE} --gpus 2 ...' (or '#SBATCH --gres=gpu:2 ...') lines at its "
            "top give options",
            show_default=False,
        ),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            "-f",
            metavar="JOBS.yaml",
            help="submit the jobs of a job file (apiVersion: gpufence/v1, kind: Job; several "
            "documents allowed; README 'Job files, scripts, arrays and dependencies')",
            show_default=False,
        ),
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option(
            "--gpus",
            metavar="N",
            min=0,
            help="whole GPUs per replica; 0: a CPU-only step (one core unless --cpus)",
        ),
    ] = None,
    mig: Annotated[
        str | None,
        typer.Option("--mig", metavar="PROFILE", help="one MIG instance per replica, e.g. 1g.10gb"),
    ] = None,
    gpu_fraction: Annotated[
        float | None,
        typer.Option("--gpu-fraction", metavar="F", help="a share of one GPU, 0 < F < 1"),
    ] = None,
    gpu_mem: Annotated[
        float | None,
        typer.Option("--gpu-mem", metavar="GIB", help="GiB of GPU memory with --gpu-fraction"),
    ] = None,
    replicas: Annotated[
        int | None,
        typer.Option(
            "--replicas",
            metavar="R",
            help="gang size: R members placed together as one job (serving: see --instances)",
        ),
    ] = None,
    instances: Annotated[
        int | None,
        typer.Option(
            "--instances",
            metavar="N",
            min=1,
            help="serving: a deployment of N replicas, each a job of its own sharing --name "
            "(scaled, placed and stopped one by one)",
        ),
    ] = None,
    partition: Annotated[
        str | None,
        typer.Option(
            "--partition",
            metavar="NAME",
            help="partition (fence) to run in [default: one that admits its class]",
        ),
    ] = None,
    queue: Annotated[
        str | None,
        typer.Option(
            "--queue", metavar="NAME", help="queue to wait in [default: the tenant's queue]"
        ),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(
            "--priority", metavar="P", help="higher runs first within its queue [default: 0]"
        ),
    ] = None,
    checkpointable: Annotated[
        bool,
        typer.Option(
            "--checkpointable",
            help="it checkpoints on notice (may be preempted, lent capacity, requeued)",
        ),
    ] = False,
    est_runtime: Annotated[
        float | None,
        typer.Option(
            "--est-runtime", metavar="SECONDS", help="estimated runtime (s), for backfill"
        ),
    ] = None,
    cpus: Annotated[
        float | None,
        typer.Option(
            "--cpus",
            metavar="N",
            help="CPU cores per replica (placed, and the job is held to them)",
        ),
    ] = None,
    mem: Annotated[
        str | None,
        typer.Option(
            "--mem",
            metavar="SIZE",
            help="host memory per replica, e.g. 8G (over it the job is OOM-killed)",
        ),
    ] = None,
    log_limit: Annotated[
        str | None,
        typer.Option(
            "--log-limit",
            metavar="SIZE",
            help="cap on each replica's stdout and stderr, e.g. 100M (past it the log keeps its "
            "start and newest output) [default: the partition's, which is also the most]",
        ),
    ] = None,
    time_limit: Annotated[
        str | None,
        typer.Option(
            "--time-limit",
            metavar="DURATION",
            help="stop each attempt after this long, e.g. 90 (s), 30m, 2h, 1d, 01:30:00",
        ),
    ] = None,
    slo_p99_ms: Annotated[
        float | None,
        typer.Option(
            "--slo-p99-ms", metavar="MS", help="serving: the p99 latency (ms) it serves users at"
        ),
    ] = None,
    metrics_url: Annotated[
        str | None,
        typer.Option(
            "--metrics-url",
            metavar="URL",
            help="serving: the replica's Prometheus endpoint; gpufence reads its latency "
            "histogram (*_request_duration_seconds) from it",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            metavar="PORT",
            help="serving: as --metrics-url, http://<its node>:PORT/metrics",
        ),
    ] = None,
    latency_metric: Annotated[
        str | None,
        typer.Option(
            "--latency-metric",
            metavar="NAME",
            help="serving: the histogram to read [default: any *_request_duration_seconds]",
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", metavar="KEY=VALUE", help="an environment variable (repeatable)"),
    ] = None,
    workload_class: Annotated[
        str | None,
        typer.Option(
            "--class",
            metavar="CLASS",
            help="training (default), serving, interactive or batch",
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            metavar="NAME",
            help="a name for it, usable wherever its id is (unique among your jobs not ended)",
        ),
    ] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option(
            "--max-attempts",
            metavar="N",
            help="runs at most N times (requeues after a lost node or restart) [default: 3]",
        ),
    ] = None,
    cwd: Annotated[
        str | None,
        typer.Option("--cwd", metavar="DIR", help="working directory [default: the current one]"),
    ] = None,
    container: Annotated[
        str | None,
        typer.Option(
            "--container",
            metavar="IMAGE",
            help="run in this image, on the server: an Apptainer/Singularity .sif or a "
            "directory holding a root file system; the working directory is mounted in",
        ),
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option("--tenant", metavar="NAME", help="admin only: submit on behalf of a tenant"),
    ] = None,
    array: Annotated[
        str | None,
        typer.Option(
            "--array",
            metavar="SPEC",
            help="one job per index: 0-99, 1,3,5-7, 0-20:2; %N caps how many run at once "
            "(0-99%8); each gets GPUFENCE_ARRAY_TASK_ID and GPUFENCE_ARRAY_JOB_ID",
        ),
    ] = None,
    after_ok: Annotated[
        list[str] | None,
        typer.Option(
            "--after-ok",
            metavar="JOB[,JOB]",
            help="start after these jobs (ids or names) succeeded; cancelled if one fails",
        ),
    ] = None,
    after_any: Annotated[
        list[str] | None,
        typer.Option(
            "--after-any", metavar="JOB[,JOB]", help="start after these jobs ended, however"
        ),
    ] = None,
    after_not_ok: Annotated[
        list[str] | None,
        typer.Option(
            "--after-not-ok",
            metavar="JOB[,JOB]",
            help="start after these jobs ended without success; cancelled if one succeeds",
        ),
    ] = None,
    hold: Annotated[
        bool, typer.Option("--hold", help="submit on hold: pending until 'gpufence release'")
    ] = False,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait", help="wait until the job ends and exit with its code: " + WAIT_CODES
        ),
    ] = False,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            metavar="KEY",
            help="submitting again with the same KEY returns the job made the first time, "
            "never a second one [default: a fresh one per submit, reused by its retries]",
            show_default=False,
        ),
    ] = None,
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
