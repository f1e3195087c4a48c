"""``gpufence update`` (as Slurm's ``scontrol update``): change pending or running jobs.

``gpufence update j4 --time-limit 30m`` lowers a job's time limit (counted from its attempt's
start); ``--priority``, and for a pending job ``--partition`` / ``--queue``. The server judges
each change as a submit would, and who may make it (a tenant only lowers a time limit, and
raises a priority no higher than the default 0; the admin may do either): its refusal is
printed as it gave it. Every change is an ``update`` event in ``gpufence events JOB``.
Exit codes as ``hold``: 0, 2 for bad input (an unknown job, a value a submit would refuse),
1 when the server refused the change (403, 409).
"""

from __future__ import annotations

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
from gpufence.cli.job_verbs import HoldArgs, failed_exit
from gpufence.cli.render import err_console
from gpufence.cli.units import format_duration, parse_duration
from gpufence.control.http.client import ClientError


def _changes(
    priority: int | None, time_limit: str | None, partition: str | None, queue: str | None
) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if priority is not None:
        changes["priority"] = priority
    if time_limit is not None:
        try:
            changes["time_limit_s"] = parse_duration(time_limit)
        except ValueError as exc:
            raise fail(f"--time-limit {exc}") from None
    if partition is not None:
        changes["partition"] = partition
    if queue is not None:
        changes["queue"] = queue
    if not changes:
        raise fail("give what to change: --priority, --time-limit, --partition or --queue")
    return changes


def _said(changes: dict[str, Any]) -> str:
    return ", ".join(
        f"time limit {format_duration(v)}" if k == "time_limit_s" else f"{k} {v}"
        for k, v in changes.items()
    )


def update(
    jobs: HoldArgs,
    priority: Annotated[
        int | None,
        typer.Option(
            "--priority",
            metavar="N",
            help="new priority (-1000..1000); a tenant may lower it, or raise it up to 0",
        ),
    ] = None,
    time_limit: Annotated[
        str | None,
        typer.Option(
            "--time-limit",
            metavar="DURATION",
            help="new time limit of each attempt, from its start, e.g. 30m, 2h, 01:30:00 "
            "(a tenant may only lower it)",
        ),
    ] = None,
    partition: Annotated[
        str | None,
        typer.Option("--partition", metavar="NAME", help="move a pending job to this partition"),
    ] = None,
    queue: Annotated[
        str | None,
        typer.Option("--queue", metavar="NAME", help="move a pending job to this queue"),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Change pending or running jobs (ids, array ids or names): priority and time limit;
    partition and queue while pending."""
    changes = _changes(priority, time_limit, partition, queue)
    client = client_for(url, token, data, context)
    failed: list[ClientError] = []
    with client_errors():
        for ref in jobs:
            try:
                res = client.update(ref, changes)
            except ClientError as exc:
                if len(jobs) == 1:
                    raise
                failed.append(exc)
                err_console().print(f"{ref}: {exc}", markup=False, soft_wrap=True)
                continue
            for j in res["jobs"]:
                typer.echo(f"{j['id']}: {j['state']}, updated: {_said(changes)}")
    if failed:
        raise typer.Exit(failed_exit(failed))
