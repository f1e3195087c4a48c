"""What of a data directory still runs, found without trusting the store: its job and attempt
directories, its members' cgroups (by name: nothing a job wrote is trusted), the attempts with a
live member. Start-up asks it before it believes the store (``recovery``, ``strangers``); the
crash harness, to clean up after itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpufence.control.base.jobdirs import JOBS_DIR
from gpufence.control.base.member_records import RECORDS_SUFFIX
from gpufence.control.containment.cgroup import MemberCgroup
from gpufence.control.containment.members import Containment, member_cgroup_name
from gpufence.control.executors.leftovers import (
    ProcessGroups,
    live_member_pids,
    recorded_ranks,
)

SHOWN = 5
"""Items an error message lists before 'and N more'."""


def listed(items: Sequence[str], shown: int = SHOWN) -> str:
    """``a, b, c and 4 more``: a list for one line of an error message."""
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


def job_dirs(data_dir: Path) -> list[tuple[int, Path]]:
    """(number, path) of every ``DATA/jobs/j<N>`` directory."""
    out = []
    try:
        entries = list((data_dir / JOBS_DIR).iterdir())
    except OSError:
        return []
    for p in entries:
        if p.name.startswith("j") and p.name[1:].isdigit():
            out.append((int(p.name[1:]), p))
    return sorted(out)


def attempt_dirs(jdir: Path) -> list[tuple[int, Path]]:
    """(attempt, path) of every ``attempt-N`` directory of a job (not its records dirs)."""
    out = []
    for adir in jdir.glob("attempt-*"):
        n = adir.name.removeprefix("attempt-")
        if n.isdigit() and not adir.name.endswith(RECORDS_SUFFIX):
            out.append((int(n), adir))
    return sorted(out)


def member_cgroups(
    containment: Containment | None, job_id: str, attempt: int, adir: Path, ranks: int
) -> list[MemberCgroup | None]:
    """The cgroups (by name: nothing the job wrote is trusted) of an attempt's members."""
    if containment is None:
        return []
    return [
        containment.driver.open(member_cgroup_name(job_id, attempt, adir, rank))
        for rank in range(ranks)
    ]


def live_attempts(data_dir: Path, containment: Containment | None = None) -> list[str]:
    """``j3 attempt 1 (pid 123)`` for every attempt directory with a member that still runs
    (a launcher, what its dead launcher left in its process group, or anything in its cgroup)."""
    found = []
    groups = ProcessGroups()  # one look at /proc for every attempt
    for _n, jdir in job_dirs(data_dir):
        for attempt, adir in attempt_dirs(jdir):
            ranks = max(recorded_ranks(adir), default=-1) + 1
            cgroups = member_cgroups(containment, jdir.name, attempt, adir, max(ranks, 1))
            pids = live_member_pids(adir, cgroups, groups)
            if pids:
                found.append(f"{jdir.name} attempt {attempt} (pid {pids[0]})")
    return found
