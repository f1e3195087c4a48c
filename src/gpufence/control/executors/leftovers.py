"""What is left running of a member whose launcher died, found and killed before it is settled.

A launcher killed while the control plane was down (the OOM killer, an operator) leaves its
job running: the job's processes in the member's cgroup (containment on), and in its process
group (whose id is the dead launcher's pid). Recovery must not settle, requeue or re-bind such an
attempt while any of that runs, or the job would run twice, beside the next one on its GPUs
(issue 11, case 3). So for a member whose launcher is gone:

* its **cgroup** (found again by name, ``Containment.open``: nothing the job wrote is trusted) is
  killed whole, which reaches the processes that left the process group too (``setsid``,
  double forks, daemons), waited for until empty, and removed;
* what is left of its **process group** is killed and waited for (the only handle without
  containment; the leader's start time guards against a reused group id);
* a member with no exit record gets a "lost" one (no code), so the attempt is requeued as the
  next attempt, never counted as done.

Every wait is bounded (``LEFTOVER_WAIT_S``); a cgroup that will not empty (a process stuck in
the kernel) is kept and reported, so the executor goes on draining it and its GPUs stay held.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufence.control.base.member_records import (
    atomic_write,
    exit_file,
    proc_start_time,
    proc_stat_fields,
    records_dir,
)
from gpufence.control.base.record_reads import recorded_exit, recorded_pid
from gpufence.control.containment.cgroup import ContainmentError, MemberCgroup
from gpufence.control.executors.processes import attach, killpg, wait_readable, waitid

log = logging.getLogger("gpufence.executor")

LEFTOVER_WAIT_S = 10.0
"""How long adoption waits for the killed leftovers of a member to be gone."""
_POLL_S = 0.005


@dataclass(slots=True)
class Leftovers:
    """What was found of one member and killed."""

    pids: set[int] = field(default_factory=set)
    """Processes that still ran (its cgroup's and its process group's, together)."""
    stuck: MemberCgroup | None = None
    """Its cgroup, when it did not empty in time (kept: the executor goes on draining it)."""


class ProcessGroups:
    """Every live process by its process group, read from ``/proc`` once, when first asked.

    A start-up that looks at many attempts (a damaged store's hint, the strangers' check) asks
    about each one's group: one pass over ``/proc`` for all of them, not one per attempt (300
    attempts took 12.9 s, issue 30 item 10). Only for a look at one moment; waiting for a group
    to empty needs a fresh look each time (``group_leftovers`` without a table)."""

    def __init__(self) -> None:
        self._groups: dict[int, list[tuple[int, int]]] | None = None
        self.scans = 0

    def members(self, pgid: int) -> list[tuple[int, int]]:
        """(pid, start time) of each live process of group ``pgid``."""
        if self._groups is None:
            self._groups = _scan_groups()
            self.scans += 1
        return self._groups.get(pgid, [])


def _scan_groups() -> dict[int, list[tuple[int, int]]]:
    out: dict[int, list[tuple[int, int]]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        fields = proc_stat_fields(int(name))
        if fields is None or len(fields) < 20 or fields[0] in ("Z", "X"):
            continue
        out.setdefault(int(fields[2]), []).append((int(name), int(fields[19])))
    return out


def group_leftovers(pgid: int, leader_start: int, groups: ProcessGroups | None = None) -> list[int]:
    """Live processes of the process group whose leader (the member's launcher, pid ==
    ``pgid``, started at ``leader_start``) has exited: what a dead launcher leaves running.
    ``groups``: a snapshot shared by many such questions (else ``/proc`` is read now).

    While any process is in the group, the kernel does not reuse the number ``pgid``; so if a
    process with that pid runs and it is not the launcher, the group is long gone and the pid
    was reused: nothing is ours. Zombies count as gone (they hold nothing)."""
    if pgid <= 1:
        return []
    now = proc_start_time(pgid)
    if now is not None and now != leader_start:
        return []
    members = (groups or ProcessGroups()).members(pgid)
    return [pid for pid, start in members if start >= leader_start]


def kill_group_leftovers(adir: Path, rank: int, wait_s: float = LEFTOVER_WAIT_S) -> list[int]:
    """SIGKILL whatever is left of rank ``rank``'s process group and wait until it is gone.
    Returns the pids it found (empty: nothing was left)."""
    rec = recorded_pid(adir, rank)
    if rec is None:
        return []
    pgid, start = rec
    left = group_leftovers(pgid, start)
    if not left:
        return []
    log.warning(
        "%s rank %d: its launcher is gone but %d process(es) of its group still run (%s); "
        "killing them before the attempt is settled",
        adir,
        rank,
        len(left),
        ",".join(map(str, left[:8])),
    )
    killpg(pgid, signal.SIGKILL)
    end = time.monotonic() + wait_s
    while group_leftovers(pgid, start):
        if time.monotonic() > end:
            log.error("%s rank %d: processes of its group survive SIGKILL", adir, rank)
            break
        time.sleep(0.01)
    return left


def kill_cgroup(cg: MemberCgroup, wait_s: float = LEFTOVER_WAIT_S) -> tuple[list[int], bool]:
    """SIGKILL everything in the member's cgroup, wait until it is empty, remove it. Returns
    the pids it held and whether it emptied (False: it is kept, the log says which pids)."""
    pids = cg.pids()
    if pids:
        log.warning(
            "cgroup %s: its launcher is gone but %d process(es) still run in it (%s); killing "
            "them before the attempt is settled",
            cg.name,
            len(pids),
            ",".join(map(str, pids[:8])),
        )
    end = time.monotonic() + wait_s
    while True:
        with contextlib.suppress(ContainmentError):
            cg.kill()  # again while it is not empty: forks racing the kill
        if cg.empty():
            break
        if time.monotonic() > end:
            log.error("cgroup %s still holds pids %s after SIGKILL", cg.name, cg.pids()[:10])
            return pids, False
        time.sleep(_POLL_S)
    for _ in range(20):
        if cg.remove():
            break
        time.sleep(_POLL_S)
    else:
        log.warning("cannot remove the empty cgroup %s; it is left behind", cg.name)
    return pids, True


def kill_leftovers(
    adir: Path, rank: int, cgroup: MemberCgroup | None, why: str, wait_s: float = LEFTOVER_WAIT_S
) -> Leftovers:
    """Kill all that is left of a member whose launcher is gone (see the module docstring): its
    cgroup, then its process group; a member that had to be killed and left no exit code gets
    a "lost" record (``why``)."""
    out = Leftovers()
    if cgroup is not None:
        pids, emptied = kill_cgroup(cgroup, wait_s)
        out.pids.update(pids)
        if not emptied:
            out.stuck = cgroup
    out.pids.update(kill_group_leftovers(adir, rank, wait_s))
    if out.pids:
        record_lost(adir, rank, why)
    return out


def record_lost(adir: Path, rank: int, why: str) -> None:
    """An exit record with no code (the member's outcome is unknown) but the time its last
    process was gone, so histories read from the attempt directory close its interval."""
    if recorded_exit(adir, rank) is not None:
        return
    text = json.dumps({"code": None, "ended_unix": time.time(), "lost": why}) + "\n"
    try:
        atomic_write(exit_file(adir, rank), text, fsync=True)
    except OSError as exc:
        log.warning("%s rank %d: cannot record its end: %s", adir, rank, exc)


def settle_untracked_attempt(
    adir: Path, ranks: int, cgroups: Sequence[MemberCgroup | None] = ()
) -> tuple[int | None, ...]:
    """An attempt directory the store has no record of (it lost its last writes: a power cut,
    a failed disk repaired by fsck): stop whatever of it still runs (launchers, their cgroups
    ``cgroups[rank]``, their groups' leftovers) and return each rank's recorded code (None:
    unknown). Nothing of it runs afterwards."""
    for rank in range(ranks):
        pid, fd = attach(adir, rank)
        if fd is not None:
            killpg(pid, signal.SIGKILL)
            wait_readable(fd, LEFTOVER_WAIT_S)
            waitid(fd)
            os.close(fd)
        cg = cgroups[rank] if rank < len(cgroups) else None
        kill_leftovers(adir, rank, cg, "killed at recovery: the store had lost the attempt")
    return tuple(recorded_exit(adir, rank) for rank in range(ranks))


def recorded_ranks(adir: Path) -> list[int]:
    """Ranks of the attempt that have a pid record (were spawned)."""
    out = []
    for base in (records_dir(adir), adir):  # (in ``adir`` itself: attempts of older versions)
        for path in base.glob("rank-*.pid"):
            rank_s = path.name.removeprefix("rank-").removesuffix(".pid")
            if rank_s.isdigit():
                out.append(int(rank_s))
    return sorted(set(out))


def live_member_pids(
    adir: Path, cgroups: Sequence[MemberCgroup | None] = (), groups: ProcessGroups | None = None
) -> list[int]:
    """Pids of this attempt directory's members that still run: live launchers, the processes
    in their cgroups, or the leftovers of a launcher that died (all hold the attempt's GPUs).
    ``groups``: one look at ``/proc`` shared by the caller's questions about many attempts."""
    out: list[int] = []
    for cg in cgroups:
        if cg is not None:
            out += cg.pids()
    for rank in recorded_ranks(adir):
        pid, fd = attach(adir, rank)
        if fd is not None:
            os.close(fd)
            out.append(pid)
            continue
        rec = recorded_pid(adir, rank)
        if rec is not None:
            out += group_leftovers(*rec, groups)
    return list(dict.fromkeys(out))
