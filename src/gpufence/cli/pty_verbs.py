"""``gpufence run --pty`` and ``gpufence attach``: interactive work, as Slurm's ``srun --pty``
and ``salloc`` give it.

``run --pty -- CMD`` submits CMD as a pty job (``pty: true``: one replica, one attempt, class
``interactive`` unless ``--class`` says otherwise) through the scheduler like any job -- same
fences, quotas and queues -- and prints why it waits while it does. Once it runs, the user's
terminal is joined to the job's (``pty_session.py``) until the command exits; ``run`` exits
with its code. Ctrl-C while it waits cancels it. When the client goes away (a closed laptop),
the job lives on for ``--grace`` with nobody attached (``gpufence attach JOB`` takes it up
again), then its session is hung up and its GPUs freed.

``attach JOB`` joins a running pty job's terminal (its owner or the admin); several clients
may share one terminal, each seeing the output (the last 64 KiB first).
"""

from __future__ import annotations

import os
import time
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
from gpufence.cli.jobrefs import exit_code_of, resolve_one
from gpufence.cli.pty_session import Session
from gpufence.cli.render import TERMINAL_STATES, err_console
from gpufence.cli.submit_body import parse_env, parsed_duration, parsed_size
from gpufence.cli.submit_options import CwdOpt
from gpufence.cli.terminal_link import LinkRefused, TerminalLink
from gpufence.control.http.client import Client

POLL_S = 0.5
LOST_EXIT = 1


def _say(text: str) -> None:
    err_console().print(text, markup=False, soft_wrap=True, style="dim")


def _body(command: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """The submit body of ``run``'s options."""
    body: dict[str, Any] = {
        "command": command,
        "cwd": options.pop("cwd") or os.getcwd(),
        "pty": True,
        "max_attempts": 1,  # a session is not run again after a lost node or a restart
        "mem_bytes": parsed_size(options.pop("mem"), "--mem"),
        "time_limit_s": parsed_duration(options.pop("time_limit"), "--time-limit"),
        "pty_grace_s": parsed_duration(options.pop("grace"), "--grace"),
    }
    env = options.pop("env") or []
    if env:
        body["env"] = parse_env(env)
    body.update(options)
    return {k: v for k, v in body.items() if v is not None}


def _wait_running(client: Client, jid: str) -> dict[str, Any]:
    """The job once it runs or has ended, saying why it waits meanwhile (each new reason
    once); Ctrl-C cancels it."""
    said = ""
    try:
        while True:
            job = client.job(jid)
            if job["state"] not in ("pending", "starting"):
                return job
            pending = job.get("pending") or {}
            line = f"{jid}: {job['state']}"
            if pending:
                line += f" ({pending.get('reason')}: {pending.get('message')})"
            if line != said:
                _say(line)
                said = line
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        client.cancel(jid)
        _say(f"{jid}: cancelled while it waited")
        raise typer.Exit(130) from None


def _join(client: Client, jid: str) -> int:
    """Join the job's terminal until its command exits: the exit code for ``run``/``attach``."""
    try:
        link = TerminalLink.open(client.url, client.token(), jid)
    except LinkRefused as exc:
        job = _settled(client, jid, 0.0) if exc.status == 409 else {}
        if job.get("state") in TERMINAL_STATES:  # it ended before the terminal was joined (a
            return _ended(jid, job)  # command not found): its end, as `submit --wait` says it
        raise fail(str(exc), 2 if exc.status in (400, 404, 422) else 1) from None
    except OSError as exc:
        raise fail(f"cannot reach {client.url}: {exc}", 1) from None
    session = Session(link)
    try:
        code = session.run()
    finally:
        link.close()
    # the end as the server records it: a command that exited, or a link that closed because
    # the job is being stopped, is settled within moments
    job = _settled(client, jid)
    ended = job["state"] in TERMINAL_STATES
    by_gpufence = job["state"] not in ("done", "failed") or job.get("reason") == "time-limit"
    if ended and (code is None or by_gpufence):
        # ended by gpufence rather than by its command (reclaimed idle, cancelled, its time
        # limit), or the link was lost first: say why, and exit as `submit --wait` would
        return _ended(jid, job)
    if code is not None:
        return code
    _say(
        f"{jid}: the terminal's connection was lost ({session.lost}); the job keeps running "
        f"for its grace with nobody attached: `gpufence attach {jid}`"
    )
    return LOST_EXIT


def _settled(client: Client, jid: str, limit_s: float = 5.0) -> dict[str, Any]:
    """The job once the server has recorded its end (the command has exited), or as it is
    after ``limit_s``."""
    end = time.monotonic() + limit_s
    job = client.job(jid)
    while job["state"] not in TERMINAL_STATES and time.monotonic() < end:
        time.sleep(0.1)
        job = client.job(jid)
    return job


def _ended(jid: str, job: dict[str, Any]) -> int:
    why = ": ".join(x for x in (job.get("reason"), job.get("message")) if x)
    _say(f"{jid}: {job['state']}" + (f" ({why})" if why else ""))
    return exit_code_of(job)


GpusOpt = Annotated[int, typer.Option("--gpus", metavar="N", help="whole GPUs")]


def run(
    command: Annotated[
        list[str],
        typer.Argument(metavar="CMD", help="after --: -- bash", show_default=False),
    ],
    pty: Annotated[
        bool, typer.Option("--pty", help="run CMD on a terminal joined to yours (required)")
    ] = False,
    gpus: GpusOpt = 1,
    workload_class: Annotated[
        str, typer.Option("--class", metavar="CLASS", help="its workload class")
    ] = "interactive",
    partition: Annotated[
        str | None,
        typer.Option("--partition", metavar="NAME", help="[default: one that admits its class]"),
    ] = None,
    queue: Annotated[
        str | None, typer.Option("--queue", metavar="NAME", help="[default: your tenant's]")
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", metavar="NAME", help="a name for it, usable wherever its id is"),
    ] = None,
    cpus: Annotated[float | None, typer.Option("--cpus", metavar="N", help="CPU cores")] = None,
    mem: Annotated[str | None, typer.Option("--mem", metavar="SIZE", help="e.g. 8G")] = None,
    time_limit: Annotated[
        str | None,
        typer.Option("--time-limit", metavar="DURATION", help="e.g. 30m, 2h, 01:30:00"),
    ] = None,
    grace: Annotated[
        str | None,
        typer.Option(
            "--grace",
            metavar="DURATION",
            help="how long the job outlives a lost client (attach again meanwhile) [default: 60]",
        ),
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", metavar="KEY=VALUE", help="(repeatable)")
    ] = None,
    cwd: CwdOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Run CMD interactively once the scheduler gives it its GPUs (srun --pty): your terminal
    is the job's until CMD exits; exits with CMD's code."""
    if not pty:
        raise fail("run needs --pty (a batch run is `gpufence submit --wait -- CMD`)")
    if gpus < 0:
        raise typer.BadParameter(f"{gpus} is not 0 or more", param_hint="--gpus")
    options = {"gpus": gpus, "class": workload_class, "partition": partition, "queue": queue}
    options |= {"name": name, "cpus": cpus, "mem": mem, "time_limit": time_limit}
    options |= {"grace": grace, "env": env, "cwd": cwd}
    body = _body(command, options)
    client = client_for(url, token, data, context)
    with client_errors():
        jid = str(client.submit(body)["id"])
        job = _wait_running(client, jid)
        if job["state"] in TERMINAL_STATES:
            raise typer.Exit(_ended(jid, job))
        _say(f"{jid}: running; your terminal is its terminal until its command exits")
        raise typer.Exit(_join(client, jid))


def attach(
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="a running pty job (id or name)")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Join a running pty job's terminal (`run --pty`); exits with its command's code when it
    exits."""
    client = client_for(url, token, data, context)
    with client_errors():
        jid = resolve_one(client, job_id)
        raise typer.Exit(_join(client, jid))
