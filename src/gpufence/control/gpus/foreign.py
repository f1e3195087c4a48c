"""Foreign GPU processes: a process NVML reports on a GPU that no job holding the GPU owns.

Which job a pid belongs to is asked of a ``PidOwner`` ("pid -> (job, attempt) or None").
``MemberMatcher`` answers it by the member's cgroup where containment gives it one
(``MemberRef.cgroup``, from ``Containment.path_of``): a job's process cannot leave it, whatever it
does (``setsid``, double forks). Without containment, by the gang members' launchers: each is
the leader of its own process group (and, started by path, session), so every process of the
member has that session or group id unless it broke away with ``setsid`` -- which then counts as
foreign, itself worth reporting.

``ForeignCheck.check`` compares one GPU's process list with the jobs that hold the GPU; each
process that belongs to none of them is an incident: counted (``/metrics``), logged with pid,
user and command, shown on ``nodes`` (the board) while it lasts, and with the ``kill`` policy
(``control.foreign_gpu_processes``) killed. gpufence's own processes there (the MPS control
daemon and the MPS server it starts) are not foreign.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from gpufence.control.base.member_records import proc_stat_fields
from gpufence.control.base.record_reads import recorded_pid
from gpufence.control.gpus.board import GpuBoard
from gpufence.control.gpus.nvml import ProcessInfo
from gpufence.control.metrics import Telemetry

log = logging.getLogger("gpufence.foreign")

Owner = tuple[str, int]  # (job id, attempt)
Policy = Literal["report", "kill"]


class PidOwner(Protocol):
    def owner(self, pid: int) -> Owner | None:
        """The attempt the process belongs to, or None (no gpufence job's)."""
        ...


@dataclass(frozen=True)
class ProcFacts:
    """What /proc says about a process."""

    pid: int
    start_time: int  # clock ticks since boot: tells a process from a later one with its pid
    ppid: int
    pgid: int
    sid: int
    uid: int
    command: str
    cgroups: tuple[str, ...]

    @property
    def user(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return str(self.uid)


def proc_facts(pid: int) -> ProcFacts | None:
    """The process's identity from /proc, or None if it is gone (or not visible from here)."""
    fields = proc_stat_fields(pid)
    if fields is None or len(fields) < 20 or fields[0] in "ZX":
        return None  # gone, or exited and not yet reaped (a zombie holds no GPU)
    base = Path(f"/proc/{pid}")
    try:
        raw = (base / "cmdline").read_bytes()
        status = (base / "status").read_text(errors="replace")
    except OSError:
        return None
    uid = next((int(x.split()[1]) for x in status.splitlines() if x.startswith("Uid:")), -1)
    command = " ".join(a.decode(errors="replace") for a in raw.split(b"\0") if a)
    if not command:
        command = next(
            (x.split(None, 1)[1] for x in status.splitlines() if x.startswith("Name:")), "?"
        )
    cgroups: tuple[str, ...] = ()
    with contextlib.suppress(OSError):
        cgroups = tuple(
            line.split(":", 2)[2] for line in (base / "cgroup").read_text().splitlines() if line
        )
    return ProcFacts(
        pid, int(fields[19]), int(fields[1]), int(fields[2]), int(fields[3]), uid, command, cgroups
    )


def launcher_pid(attempt_dir: Path, rank: int) -> int | None:
    """The member's launcher pid from its ``rank-R.pid`` record, if that process still runs."""
    rec = recorded_pid(attempt_dir, rank)
    if rec is None:
        return None
    pid, start = rec
    fields = proc_stat_fields(pid)
    if fields is None or len(fields) < 20 or int(fields[19]) != start or fields[0] in "ZX":
        return None
    return pid


@dataclass(frozen=True)
class MemberRef:
    """One running gang member, as the matcher needs it."""

    job_id: str
    attempt: int
    rank: int
    launcher_pid: int | None
    gpus: frozenset[int]  # GPU indices (on this node) the member holds
    cgroup: str | None = None  # its own cgroup (containment on), as /proc/PID/cgroup names it


class MemberMatcher:
    """``PidOwner`` by cgroup (members that have one), else by the launcher's session or
    process group; ``system`` pids (gpufence's MPS daemons) own their sessions and children."""

    def __init__(
        self,
        members: Iterable[MemberRef],
        system: Iterable[int] = (),
        facts: Callable[[int], ProcFacts | None] = proc_facts,
    ) -> None:
        self.members = list(members)
        self._by_leader = {m.launcher_pid: m for m in self.members if m.launcher_pid}
        self._by_cgroup = {m.cgroup: m for m in self.members if m.cgroup}
        self.system = set(system)
        self._facts = facts

    def member(self, pid: int, facts: ProcFacts | None = None) -> MemberRef | None:
        f = facts or self._facts(pid)
        if f is None:
            return None
        for cg in f.cgroups:
            for path, m in self._by_cgroup.items():
                if cg == path or cg.startswith(path.rstrip("/") + "/"):
                    return m
        return self._by_leader.get(f.sid) or self._by_leader.get(f.pgid)

    def owner(self, pid: int) -> Owner | None:
        m = self.member(pid)
        return None if m is None else (m.job_id, m.attempt)

    def is_system(self, f: ProcFacts) -> bool:
        return bool({f.pid, f.sid, f.pgid, f.ppid} & self.system)

    def holders(self, gpu: int) -> set[Owner]:
        return {(m.job_id, m.attempt) for m in self.members if gpu in m.gpus}


@dataclass
class Incident:
    gpu: int  # global GPU id
    index: int  # GPU index on the node
    pid: int
    start_time: int
    user: str
    command: str
    owner: Owner | None  # the job it belongs to (one that does not hold this GPU), if any
    first_seen: float = field(default_factory=time.time)
    action: str = "reported"

    def shown(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "user": self.user,
            "command": self.command[:200],
            "job": self.owner[0] if self.owner else None,
            "action": self.action,
            "since": round(self.first_seen, 3),
        }


class ForeignCheck:
    """Incidents per GPU across samples (see the module docstring)."""

    def __init__(
        self,
        board: GpuBoard,
        telemetry: Telemetry | None = None,
        policy: Policy = "report",
        facts: Callable[[int], ProcFacts | None] = proc_facts,
    ) -> None:
        self.board = board
        self.telemetry = telemetry
        self.policy: Policy = policy
        self._facts = facts
        self._open: dict[tuple[int, int, int], Incident] = {}  # (gpu, pid, start) -> incident

    def check(
        self, gid: int, index: int, procs: Sequence[ProcessInfo], matcher: MemberMatcher
    ) -> list[Incident]:
        """One GPU's processes; returns the incidents that are new in this sample."""
        holders = matcher.holders(index)
        seen: set[tuple[int, int, int]] = set()
        new: list[Incident] = []
        for p in procs:
            pid = int(p.pid)
            f = self._facts(pid)
            if f is None or pid == os.getpid() or matcher.is_system(f):
                continue  # gone since NVML listed it, not visible from here, or gpufence's own
            m = matcher.member(pid, f)
            owner = None if m is None else (m.job_id, m.attempt)
            if owner is not None and owner in holders:
                continue
            key = (gid, pid, f.start_time)
            seen.add(key)
            if key in self._open:
                continue
            inc = Incident(gid, index, pid, f.start_time, f.user, f.command, owner)
            self._open[key] = inc
            new.append(inc)
            whose = f"of job {owner[0]}, which does not hold this GPU" if owner else "of no job"
            log.warning(
                "foreign process on GPU %d: pid %d, user %s, command %r (%s)",
                index,
                pid,
                f.user,
                f.command[:200],
                whose,
            )
            if self.telemetry is not None:
                self.telemetry.foreign_process(index)
            if self.policy == "kill":
                inc.action = _kill(f)
        for key in [k for k in self._open if k[0] == gid and k not in seen]:
            del self._open[key]
        current = [i.shown() for k, i in sorted(self._open.items()) if k[0] == gid]
        self.board.set(gid, foreign=current or None)
        return new


def _kill(f: ProcFacts) -> str:
    """SIGKILL the process if it is still the one that was seen (not a reused pid)."""
    now = proc_stat_fields(f.pid)
    if now is None or len(now) < 20 or int(now[19]) != f.start_time:
        return "gone"
    try:
        os.kill(f.pid, signal.SIGKILL)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        log.error("cannot kill foreign process %d (user %s): permission denied", f.pid, f.user)
        return "kill failed: permission denied"
    log.warning("killed foreign process %d on a GPU (user %s, %r)", f.pid, f.user, f.command[:200])
    return "killed"
