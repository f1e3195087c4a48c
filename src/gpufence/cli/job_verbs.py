"""Client verbs about jobs: ``queue``, ``status``, ``explain``, ``cancel``.

Each takes the connection flags of ``connect.py`` and (but ``cancel``) ``-o table|wide|json|yaml``
(``output.py``). ``-o json`` documents:

* ``queue``: ``{"jobs": [JOB, ...], "more": N}`` (JOB as ``GET /v1/jobs`` returns it; ``more``:
  the matching jobs ``--limit`` left out);
* ``status``: JOB as ``GET /v1/jobs/{id}`` returns it (with ``attempts``), plus ``failure``: the
  one-line explanation of a failed, cancelled, reclaimed or rejected job, else null;
* ``explain``: the object of ``GET /v1/jobs/{id}/explain``.
"""

from __future__ import annotations

import codecs
import unicodedata
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.text import Text

from gpufence.cli.array_status import one_array, show_array
from gpufence.cli.connect import (
    ContextOpt,
    DataOpt,
    TokenOpt,
    UrlOpt,
    client_errors,
    client_for,
    fail,
)
from gpufence.cli.failure import failing_rank, failure_line
from gpufence.cli.jobrefs import named_jobs, resolve_many, resolve_one
from gpufence.cli.jobtables import attempts_table, fair_share_table, queue_table, status_grid
from gpufence.cli.output import (
    CountOpt,
    Frame,
    IntervalOpt,
    LimitOpt,
    OutputOpt,
    WatchFlag,
    check_format,
    more_footer,
    page_all,
    show,
    watch,
)
from gpufence.cli.render import ACTIVE_STATES, err_console, styled, when
from gpufence.control.http.client import Client, ClientError

JobArg = Annotated[
    str,
    typer.Argument(
        metavar="JOB",
        help="job id (j12), array task (j12_3) or name; status also takes an array's id",
        show_default=False,
    ),
]
LAST_ERR_BYTES = 4096


def check_partition(client: Client, name: str) -> None:
    """Exit 2 unless ``name`` is a partition of the cluster (the API would list nothing)."""
    names = [str(p["name"]) for p in client.partitions()]
    if name not in names:
        raise fail(f"--partition: no partition '{name}' (known: {', '.join(names) or 'none'})")


# ------------------------------------------------------------------------------------- queue


def queue(
    all_jobs: Annotated[bool, typer.Option("--all", "-a", help="include ended jobs")] = False,
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            metavar="STATE",
            help="only jobs in this state (repeatable): pending, starting, running, stopping, "
            "done, failed, cancelled, reclaimed, rejected",
        ),
    ] = None,
    partition: Annotated[
        str | None,
        typer.Option("--partition", metavar="NAME", help="only this partition's jobs"),
    ] = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", metavar="NAME", help="admin: one tenant's jobs")
    ] = None,
    limit: LimitOpt = 100,
    output: OutputOpt = "table",
    watching: WatchFlag = False,
    interval: IntervalOpt = 2.0,
    count: CountOpt = 0,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Jobs waiting and running, in submission order, with why each pending job waits
    (--all: ended ones too)."""
    fmt = check_format(output)
    if limit < 0:
        raise typer.BadParameter("must be >= 0 (0: all)", param_hint="--limit")
    states = state or ([] if all_jobs else list(ACTIVE_STATES))
    client = client_for(url, token, data, context)

    def fetch() -> Frame:
        jobs, more, _ = page_all(
            lambda after, n: client.jobs(states, partition, tenant, n, after), limit
        )
        empty = None
        if not jobs:
            empty = "no jobs" + ("" if all_jobs or state else " waiting or running")
        return Frame(
            {"jobs": [gpus_as_numbers(j) for j in jobs], "more": more},
            lambda wide: queue_table(jobs, wide),
            more_footer(more, limit),
            empty,
        )

    with client_errors():
        if partition is not None:
            check_partition(client, partition)
        if watching:
            watch(fetch, fmt, interval, count)
        else:
            show(fetch(), fmt)


def gpus_as_numbers(job: dict[str, Any]) -> dict[str, Any]:
    """A job for ``-o json`` / ``yaml``: ``gpus`` a number, as in a submit body or a job file
    (GPUs per replica: whole ones, or the share of one for a fractional job), with
    ``replicas`` and ``gpus_total`` beside it; the API's words for tables (``2x 4 GPUs``)
    become ``request`` -- a script reading ``gpus`` got ``"1 GPU"`` (issue 32)."""
    spec = job.get("spec") or {}
    out = {**job, "request": job.get("gpus")}
    try:
        per = float(spec["gpu_fraction"]) if spec.get("gpu_fraction") is not None else None
        whole = int(spec.get("gpus", 1))
        replicas = int(spec.get("replicas", 1))
    except (TypeError, ValueError):
        return out  # an unreadable stored spec: the words stay the only form
    gpus: float = per if per is not None else whole
    out["gpus"], out["replicas"], out["gpus_total"] = gpus, replicas, gpus * replicas
    return out


# ------------------------------------------------------------------------------------ status


def last_err_line(client: Client, job: dict[str, Any]) -> str | None:
    """The last line the failing member of the job's last attempt wrote to stderr."""
    attempts = job.get("attempts") or []
    if not attempts:
        return None
    last = attempts[-1]
    rank = failing_rank(last)
    probe = client.logs(job["id"], int(last["attempt"]), rank, "err", 1 << 40)
    size = int(probe.headers.get("X-Log-Size") or 0)
    if size == 0:
        return None
    chunk = client.logs(job["id"], int(last["attempt"]), rank, "err", max(0, size - LAST_ERR_BYTES))
    text = codecs.decode(chunk.body, "utf-8", errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    line = visible(lines[-1])
    return line if len(line) <= 200 else line[:199] + "…"


def visible(text: str) -> str:
    """``text`` with its control characters shown as escapes (``\\x1b``): a tenant's stderr must
    not reach the admin's terminal as escape sequences (a title, a cleared screen, a link)."""
    return "".join(
        c
        if c == "\t" or unicodedata.category(c)[0] != "C"
        else f"\\x{ord(c):02x}"
        if ord(c) < 256
        else f"\\u{ord(c):04x}"
        for c in text
    )


def status(
    job_id: JobArg,
    output: OutputOpt = "table",
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """A job: its state, attempts (where, which devices, how each ended) and, when it failed,
    why in one line (exit code and the last line of stderr, signal, oom, time-limit, command
    not found)."""
    fmt = check_format(output)
    client = client_for(url, token, data, context)
    with client_errors():
        named = named_jobs(client, job_id)
        array = one_array(named)
        if array is not None:  # an array's id (or its name): the array as a whole
            show_array(client, array, named, fmt)
            return
        j = client.job(resolve_one(client, job_id))
        err_line = None
        if j.get("state") == "failed" and (j.get("exit_code") or 0) > 0:
            err_line = last_err_line(client, j)
    failure = failure_line(j, err_line)
    doc = {**j, "failure": failure}

    def draw(wide: bool) -> RenderableType:
        attempts = j.get("attempts", [])
        if not attempts:
            return status_grid(j, failure)
        return Group(status_grid(j, failure), attempts_table(attempts, wide))

    show(Frame(doc, draw), fmt)


# ----------------------------------------------------------------------------------- explain


def explain(
    job_id: JobArg,
    output: OutputOpt = "table",
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Why a job waits (or runs where it runs), and its partition's fair-share order."""
    fmt = check_format(output)
    client = client_for(url, token, data, context)
    with client_errors():
        e = client.explain(resolve_one(client, job_id))

    def draw(wide: bool) -> RenderableType:
        parts: list[RenderableType] = [
            Text.assemble(
                (e["id"], "bold"),
                " ",
                styled(e["state"]),
                f"  partition {e.get('partition') or '-'}, queue {e.get('queue') or '-'}, "
                f"attempt {e.get('attempt')}",
            )
        ]
        pending = e.get("pending")
        if pending:
            parts.append(Text(f"pending: {pending['reason']}: {pending['message']}"))
        elif e.get("reason") or e.get("message"):
            parts.append(Text(f"{e.get('reason')}: {e.get('message')}".strip(": ")))
        notice = e.get("notice")
        if notice:
            parts.append(Text(f"notice: {notice['reason']} (deadline {when(notice['deadline'])})"))
        fair = e.get("fair_share") or []
        if fair:
            parts.append(fair_share_table(fair, e.get("partition"), e.get("queue"), wide))
        return Group(*parts)

    show(Frame(e, draw), fmt)


# ----------------------------------------------------------------------- cancel, hold, release

JobsArg = Annotated[
    list[str] | None,
    typer.Argument(metavar="JOB...", help="job ids or names", show_default=False),
]
CANCELLABLE = ("pending", "starting", "running")


def cancel(
    jobs: JobsArg = None,
    name: Annotated[
        str | None, typer.Option("--name", metavar="NAME", help="jobs with this name")
    ] = None,
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            metavar="STATE",
            help="only jobs in this state (repeatable): pending, starting, running",
        ),
    ] = None,
    partition: Annotated[
        str | None, typer.Option("--partition", metavar="NAME", help="only this partition's jobs")
    ] = None,
    every: Annotated[
        bool,
        typer.Option("--all", help="let filters (or none) match every job you can cancel"),
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Cancel jobs by id or name, or every job --name/--state/--partition match (a running one
    is stopped: SIGTERM, grace period, SIGKILL). Filters alone need --all when they would
    match every job, and no argument at all needs --all."""
    bad = [s for s in state or [] if s not in CANCELLABLE]
    if bad:
        raise fail(f"--state {bad[0]}: only {', '.join(CANCELLABLE)} jobs can be cancelled")
    filtered = name is not None or state or partition is not None
    if not jobs and not filtered and not every:
        raise fail(
            "give job ids or names, --name/--state/--partition, or --all to cancel every job"
        )
    client = client_for(url, token, data, context)
    with client_errors():
        if partition is not None:
            check_partition(client, partition)
        ids: list[str] = []
        for ref in jobs or []:
            ids += [i for i in resolve_many(client, ref) if i not in ids]
        if not jobs:
            states = state or list(CANCELLABLE)
            listed, _, _ = page_all(
                lambda after, n: client.jobs(states, partition, None, n, after), 0
            )
            ids = [str(j["id"]) for j in listed if name is None or j.get("name") == name]
        elif filtered:
            keep = {
                str(j["id"])
                for j in (client.job(i) for i in ids)
                if (name is None or j.get("name") == name)
                and (not state or j.get("state") in state)
                and (partition is None or j.get("partition") == partition)
            }
            ids = [i for i in ids if i in keep]
        if not ids:
            raise fail("no job matches", 1)
        failed: list[ClientError] = []
        for jid in ids:
            try:
                res = client.cancel(jid)
                typer.echo(f"{res['id']}: {res['state']}")
            except ClientError as exc:
                failed.append(exc)
                err_console().print(f"{jid}: {exc}", markup=False, soft_wrap=True)
    if failed:
        raise typer.Exit(failed_exit(failed))


def failed_exit(failed: list[ClientError]) -> int:
    """The exit code of a verb some of whose jobs failed: 2 when each failure was bad input
    (an unknown job: README's exit codes), 1 when the server refused any (403, 409, ...)."""
    return 2 if all(exc.bad_input for exc in failed) else 1


def _act(
    refs: list[str], kind: str, url: str | None, token: str | None, data: Any, ctx: str | None
) -> None:
    client = client_for(url, token, data, ctx)
    failed: list[ClientError] = []
    with client_errors():
        for ref in refs:
            try:
                res = client.hold(ref) if kind == "hold" else client.release(ref)
            except ClientError as exc:
                if len(refs) == 1:
                    raise
                failed.append(exc)
                err_console().print(f"{ref}: {exc}", markup=False, soft_wrap=True)
                continue
            for j in res["jobs"]:
                typer.echo(f"{j['id']}: {j['state']}{' (held)' if j['held'] else ''}")
    if failed:
        raise typer.Exit(failed_exit(failed))


HoldArgs = Annotated[
    list[str], typer.Argument(metavar="JOB...", help="job ids or names", show_default=False)
]


def hold(
    jobs: HoldArgs,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Hold pending jobs: they stay pending (reason 'held') until released."""
    _act(jobs, "hold", url, token, data, context)


def release(
    jobs: HoldArgs,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Release held jobs: they may run again."""
    _act(jobs, "release", url, token, data, context)
