"""``gpufence logs``: a job member's stdout and stderr, of the latest attempt that ran.

By default both streams are printed to stdout, line by line, as interleaved as the logs allow:
the executor writes them to two files (``rank-R.out``, ``rank-R.err``) without timestamps, so
their order can only be seen while they are written. Following (``-f``) a running job, both are
polled every ``POLL_S`` and each new complete line is printed when it is seen: lines written in
the same quarter second on different streams may come out of order, never lines of one stream.
Of what is already written (an ended job, or the backlog when ``-f`` starts) the stdout comes
first, then the stderr; a failed job's traceback is therefore last, where it usually belongs.
``--out`` / ``--err`` print one stream only.

Which attempt: ``--attempt N``, else the latest attempt that has started; a requeued job that is
pending shows the attempt that ran before (and says so); ``-f`` follows into each new attempt
until the job ends. A line on stderr says which attempt and rank are shown. An attempt or rank the
job does not have is an error (exit 2).
"""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass, field
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
from gpufence.cli.jobrefs import resolve_one
from gpufence.cli.render import TERMINAL_STATES, err_console
from gpufence.control.http.client import Client

POLL_S = 0.25
STREAM_NAMES = {"out": "stdout", "err": "stderr"}


@dataclass
class _Stream:
    name: str
    offset: int = 0
    partial: str = ""
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))


@dataclass
class _Poll:
    text: bool = False
    state: str = ""
    job_attempt: int = 0


def _read(client: Client, jid: str, attempt: int, rank: int, s: _Stream, poll: _Poll) -> None:
    """Print the complete new lines of stream ``s`` (reads until the file's end)."""
    while True:
        chunk = client.logs(jid, attempt, rank, s.name, s.offset)
        poll.state = chunk.headers.get("X-Job-State") or poll.state
        poll.job_attempt = int(chunk.headers.get("X-Job-Attempt") or poll.job_attempt or attempt)
        s.offset = int(chunk.headers.get("X-Log-Offset") or s.offset)
        if chunk.body:
            poll.text = True
            lines = (s.partial + s.decoder.decode(chunk.body)).split("\n")
            s.partial = lines.pop()
            if lines:
                typer.echo("\n".join(lines))
        if s.offset >= int(chunk.headers.get("X-Log-Size") or 0) or not chunk.body:
            return


def _flush(streams: list[_Stream]) -> None:
    """Print what is left of each stream (a last line without a newline gets one, but the
    very last one, which is printed as it is)."""
    tails = [s.partial + s.decoder.decode(b"", final=True) for s in streams]
    tails = [t for t in tails if t]
    for i, t in enumerate(tails):
        typer.echo(t, nl=i < len(tails) - 1)
    for s in streams:
        s.partial = ""


def _pick_attempt(jid: str, job: dict[str, Any], attempt: int | None) -> tuple[int, str | None]:
    """The attempt to show, and a note when it is not the job's current one."""
    latest = int(job.get("attempt") or 1)
    started = sorted(int(a["attempt"]) for a in job.get("attempts") or [])
    if attempt is not None:
        if not 1 <= attempt <= latest:
            have = "attempt 1" if latest == 1 else f"attempts 1-{latest}"
            raise fail(f"--attempt {attempt}: {jid} has {have}")
        if attempt not in started:
            return attempt, f"attempt {attempt} of {jid} has not started yet"
        return attempt, None
    if not started:
        return latest, f"{jid} has not started yet ({job.get('state')})"
    if started[-1] < latest:
        why = f"attempt {latest} has not started yet ({job.get('state')})"
        return started[-1], f"{jid}: {why}; showing attempt {started[-1]}, the last that ran"
    return latest, None


def logs(
    job_id: Annotated[
        str, typer.Argument(metavar="JOB", help="job id or name", show_default=False)
    ],
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="keep printing, into each new attempt, until the job ends"
        ),
    ] = False,
    attempt: Annotated[
        int | None,
        typer.Option(
            "--attempt", metavar="N", help="this attempt [default: the latest that started]"
        ),
    ] = None,
    rank: Annotated[
        int, typer.Option("--rank", metavar="R", help="gang member (0 .. replicas-1)")
    ] = 0,
    out_only: Annotated[bool, typer.Option("--out", help="stdout only")] = False,
    err_only: Annotated[bool, typer.Option("--err", help="stderr only")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Print a job's output: stdout and stderr together, line by line (--out / --err: one of
    them), of the latest attempt that ran; -f follows it, across requeues, until the job
    ends."""
    if out_only and err_only:
        out_only = err_only = False  # both asked for: both, as by default
    names = ["out"] if out_only else ["err"] if err_only else ["out", "err"]
    client = client_for(url, token, data, context)
    with client_errors():
        job_id = resolve_one(client, job_id)
        job = client.job(job_id)
        replicas = int((job.get("spec") or {}).get("replicas") or 1)
        if not 0 <= rank < replicas:
            have = "one rank (0)" if replicas == 1 else f"ranks 0-{replicas - 1}"
            raise fail(f"--rank {rank}: {job_id} has {have}")
        current, note = _pick_attempt(job_id, job, attempt)
        what = " and ".join(STREAM_NAMES[n] for n in names)
        latest = int(job.get("attempt") or 1)
        err_console().print(
            note or f"{job_id}: attempt {current} of {latest}, rank {rank}, {what}",
            markup=False,
            style="dim",
        )
        if note and not follow and current not in {a["attempt"] for a in job["attempts"]}:
            return
        _stream(client, job_id, current, rank, names, follow, pinned=attempt is not None)


def _stream(
    client: Client, jid: str, current: int, rank: int, names: list[str], follow: bool, pinned: bool
) -> None:
    streams = [_Stream(n) for n in names]
    final = False
    while True:
        poll = _Poll()
        for s in streams:
            _read(client, jid, current, rank, s, poll)
        if not follow or final:
            _flush(streams)
            return
        if poll.text:
            continue
        if not pinned and poll.job_attempt > current:
            _flush(streams)
            current = poll.job_attempt
            streams = [_Stream(n) for n in names]
            err_console().print(f"--- {jid}: attempt {current} ---", markup=False, style="dim")
        elif poll.state in TERMINAL_STATES or (pinned and poll.job_attempt > current):
            final = True  # one more read of every stream: what was written before the end
        else:
            time.sleep(POLL_S)
