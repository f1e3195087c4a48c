"""Job references on the command line: an id (``j12``) or a name, and waiting for jobs to end.

A name denotes the jobs with it that have not ended (one job, or every task of an array), else
the latest job with it; verbs about one job (``status``, ``logs``, ``explain``) refuse a name
that denotes several and list their ids. ``--wait`` polls until every job ended and turns how
they ended into the exit code (``WAIT_CODES``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpufence.cli.connect import fail
from gpufence.control.http.client import Client, ClientError

_JOB_ID = re.compile(r"j[0-9]+")

WAIT_CODES = (
    "0 done; the job's own exit code when it exited non-zero; 128+N when killed by signal N "
    "(137: the OOM killer); 124 stopped at its time limit; 3 cancelled (also: a dependency "
    "that can never be met) or reclaimed; 1 failed otherwise. An array: the first non-zero "
    "code in task order."
)
CANCELLED_EXIT = 3
TIME_LIMIT_EXIT = 124


def named_jobs(client: Client, ref: str) -> list[dict[str, Any]]:
    """The jobs ``ref`` denotes (``Client.named``; ClientError 404 when none). An id is asked
    too: it may be an array's (every task of it), as may ``j4_3`` (task 3 of the array j4).
    An id the names do not know for this token is passed on as it is: the job routes say
    whether it is another tenant's (403) or no job at all (404)."""
    try:
        return client.named(ref)
    except ClientError as exc:
        if exc.status == 404 and _JOB_ID.fullmatch(ref):
            return [{"id": ref}]
        raise


def resolve_many(client: Client, ref: str) -> list[str]:
    """The ids ``ref`` denotes (``named_jobs``)."""
    return [str(j["id"]) for j in named_jobs(client, ref)]


def resolve_one(client: Client, ref: str) -> str:
    ids = resolve_many(client, ref)
    if len(ids) > 1:
        shown = ", ".join(ids[:10]) + (", …" if len(ids) > 10 else "")
        raise fail(f"'{ref}' names {len(ids)} jobs (an array?): give one id ({shown})")
    return ids[0]


def exit_code_of(job: dict[str, Any]) -> int:
    """The ``--wait`` exit code of an ended job (``WAIT_CODES``)."""
    state = job.get("state")
    code = job.get("exit_code")
    if state == "done":
        return 0
    if state in ("cancelled", "reclaimed"):
        return CANCELLED_EXIT
    if job.get("reason") == "time-limit":
        return TIME_LIMIT_EXIT
    if isinstance(code, int) and code > 0:
        return min(code, 255)
    if isinstance(code, int) and code < 0:
        return 128 + min(-code, 127)
    return 1


def wait_for(
    client: Client,
    ids: Sequence[str],
    interval: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> list[dict[str, Any]]:
    """Every job of ``ids`` once ended, in the same order."""
    ended: dict[str, dict[str, Any]] = {}
    while True:
        for jid in ids:
            if jid in ended:
                continue
            j = client.job(jid)
            if j.get("ended_at") is not None:
                ended[jid] = j
        if len(ended) == len(ids):
            return [ended[j] for j in ids]
        sleep(interval)
        interval = min(interval * 1.5, 5.0)


def wait_exit(jobs: Sequence[dict[str, Any]]) -> int:
    for j in jobs:
        code = exit_code_of(j)
        if code:
            return code
    return 0
