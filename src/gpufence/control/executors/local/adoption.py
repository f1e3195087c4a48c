"""The local executor's attempt directories before a start and after a restart.

Before a start (``ready_attempt``): an attempt runs once, so a directory with a record of an
earlier start is refused rather than overwritten; the exit record of each member is *reserved*
(``member_records.reserved_exit_record``) in the records directory while the disk has room for it.

After a restart (``adopt_members``): the members are found again from their records, with their
cgroups (by name), and the attempt's state is made exact before anything is settled: whatever a
dead launcher left running is killed whole (``leftovers.kill_leftovers``: its cgroup, setsid
escapees included, then its process group; the cgroup removed), and a gang that was only
partly spawned is stopped, so that it is requeued as the next attempt, not failed, and never
runs beside the attempt that replaces it.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

from gpufence.control.base.executor import Launch, LaunchError, RunAs
from gpufence.control.base.jobdirs import reset_attempt
from gpufence.control.base.member_records import (
    atomic_write,
    exit_file,
    pid_file,
    reserved_exit_record,
    started_file,
)
from gpufence.control.base.record_reads import recorded_exit, recorded_pid
from gpufence.control.containment.cgroup import ContainmentError
from gpufence.control.containment.members import Containment
from gpufence.control.executors.leftovers import kill_leftovers, record_lost
from gpufence.control.executors.processes import MemberProcess, attach, killpg, reap_now

log = logging.getLogger("gpufence.executor")


def ready_attempt(adir: Path, run_as: RunAs | None, ranks: range, fresh: bool) -> None:
    """Ready the attempt directory for its one start (``fresh``: just made, nothing in it)."""
    if not fresh:
        for rank in ranks:
            pid, pidfd = attach(adir, rank)
            if pidfd is not None:
                raise LaunchError(
                    f"{adir} already has a live rank {rank} (pid {pid}): adopt it, don't start it"
                )
            for path in (pid_file(adir, rank), started_file(adir, rank)):
                if path.exists():
                    raise LaunchError(
                        f"{adir} was started before ({path.name} exists): an attempt never "
                        "runs twice"
                    )
        # made before a crash that came before any spawn: nothing of it ran; new logs
        reset_attempt(adir, run_as, ranks)
    try:
        for rank in ranks:
            atomic_write(exit_file(adir, rank), reserved_exit_record())
    except OSError as exc:
        raise LaunchError(f"cannot prepare {adir}: {exc}") from exc


def adopt_members(launch: Launch, containment: Containment | None) -> list[MemberProcess]:
    """Re-find an attempt's members after a restart, making its state exact first (see the
    module docstring). A member whose cgroup does not empty keeps it (``cgroup`` set, ``done``):
    the executor drains it, and its GPUs stay held until it is empty."""
    adir = launch.attempt_dir
    members: list[MemberProcess] = []
    never_spawned = False
    for rank in sorted(m.rank for m in launch.members):
        pid, pidfd = attach(adir, rank)
        m = MemberProcess(rank, pid, pidfd, None)
        cg = containment.open(launch, rank) if containment is not None else None
        if pidfd is None:
            never_spawned |= recorded_pid(adir, rank) is None
            left = kill_leftovers(adir, rank, cg, "killed at adoption: its launcher was gone")
            m.strays, m.cgroup = len(left.pids), left.stuck
            m.done = True
            m.code = recorded_exit(adir, rank)
        else:
            m.cgroup = cg
        members.append(m)
    if never_spawned:
        stop_half_spawned(launch, members)
    return members


def stop_half_spawned(launch: Launch, members: list[MemberProcess]) -> None:
    """The control plane died between two spawns of a gang: kill the started members whole,
    their codes unknown, so the attempt is settled as lost (requeued), not failed."""
    alive = [m for m in members if not m.done]
    if alive:
        log.warning(
            "job %s attempt %d was only partly spawned; stopping its %d started member(s) so "
            "it is requeued as the next attempt",
            launch.job_id,
            launch.attempt,
            len(alive),
        )
    for m in alive:
        if m.cgroup is not None:
            try:
                m.cgroup.kill()
            except ContainmentError as exc:
                log.error("cannot kill cgroup %s: %s", m.cgroup.name, exc)
        killpg(m.pid, signal.SIGKILL)
    reap_now(alive)
    why = "killed at adoption: gang only partly spawned"
    for m in alive:
        left = kill_leftovers(launch.attempt_dir, m.rank, m.cgroup, why)
        record_lost(launch.attempt_dir, m.rank, why)
        m.cgroup = left.stuck
        m.done, m.code = True, None  # killed by us, not ended: the attempt is lost
