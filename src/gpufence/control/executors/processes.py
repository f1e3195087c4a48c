"""The processes of a running gang member: /proc reads, process groups, pid/exit records.

A member is one launcher (``launcher.py``) started in a new session, so its whole process tree is
one process group (pgid == launcher pid). The launcher records ``rank-R.pid`` / ``rank-R.exit``
in the attempt directory; ``attach`` re-finds a recorded member that still runs (guarding against
pid reuse with the recorded start time) and ``recorded_exit`` reads how one ended. Processes are
waited for and reaped through pidfds, which also work for processes that are not our children.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufence.control.executors.launcher import exit_file, pid_file, proc_stat_fields

log = logging.getLogger("gpufence.executor")

REAP_ON_CLOSE_S = 2.0
"""How long ``reap_now`` waits, in all, for killed members to exit."""
_CLK_TCK = os.sysconf("SC_CLK_TCK")

# Popen objects of members left running by close(kill=False). Dropping them would make their
# destructor warn and put them on subprocess's cleanup list, whose waitpid() could later reap an
# unrelated child that reused the pid (the adopting executor reaps the real one through a pidfd).
DISOWNED: list[subprocess.Popen[bytes]] = []


@dataclass(eq=False, slots=True)
class MemberProcess:
    """One gang member as run here: its launcher process (and so its process group)."""

    rank: int
    pid: int
    """Launcher pid == the member's process-group id."""
    pidfd: int | None
    popen: subprocess.Popen[bytes] | None
    """Set for members this executor started (our children); None for adopted ones."""
    done: bool = False
    code: int | None = None


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def recorded_exit(adir: Path, rank: int) -> int | None:
    rec = read_json(exit_file(adir, rank))
    code = rec.get("code") if rec is not None else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def attach(adir: Path, rank: int) -> tuple[int, int | None]:
    """(pid, pidfd) of the member recorded in ``rank-R.pid`` if that very process still runs.

    The recorded start time guards against pid reuse; a zombie counts as gone (it is reaped
    here when it is our own child).
    """
    rec = read_json(pid_file(adir, rank))
    if rec is None:
        return 0, None
    pid, start_time = rec.get("pid"), rec.get("start_time")
    if not isinstance(pid, int) or not isinstance(start_time, int) or pid <= 0:
        return 0, None
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return pid, None
    # checked after the open: if it matches now, the pidfd was opened on that same process
    fields = proc_stat_fields(pid)
    if fields is None or len(fields) < 20 or int(fields[19]) != start_time:
        os.close(fd)
        return pid, None
    if fields[0] in ("Z", "X"):
        waitid(fd)
        os.close(fd)
        return pid, None
    return pid, fd


def waitid(pidfd: int) -> int | None:
    """Reap the process behind ``pidfd`` if it is our exited child; its exit code or None."""
    try:
        res = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
    except (ChildProcessError, OSError):
        return None
    if res is None:
        return None
    if res.si_code == os.CLD_EXITED:
        return res.si_status
    return -res.si_status  # CLD_KILLED / CLD_DUMPED


def settle(m: MemberProcess, code: int | None) -> None:
    m.done = True
    m.code = code
    if m.popen is not None and m.popen.returncode is None:
        # reaped through the pidfd; tell Popen so it never waitpid()s a possibly reused pid
        m.popen.returncode = code if code is not None else -signal.SIGKILL


def _wait_readable(fd: int, timeout: float) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        sel.select(max(0.0, timeout))


def killpg(pgid: int, sig: signal.Signals) -> None:
    if pgid <= 1:
        return
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as exc:
        log.warning("cannot send %s to process group %d: %s", sig.name, pgid, exc)


def member_pgids(members: Iterable[MemberProcess]) -> set[int]:
    # pid 0 = no record; process group 0 holds kernel threads, which are nobody's job
    return {m.pid for m in members if m.pid > 1}


def group_cpu_by_pgid(pgids: set[int]) -> dict[int, float]:
    """CPU seconds (utime+stime, plus reaped children's) per process group, from /proc."""
    totals = dict.fromkeys(pgids, 0)
    if not pgids:
        return {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if not name.isdigit():
            continue
        fields = proc_stat_fields(int(name))
        if fields is None or len(fields) < 15:
            continue
        pgrp = int(fields[2])  # field 5
        if pgrp in totals:
            totals[pgrp] += sum(int(f) for f in fields[11:15])  # fields 14-17
    return {pgid: ticks / _CLK_TCK for pgid, ticks in totals.items()}


def group_cpu(pgids: set[int]) -> float:
    return sum(group_cpu_by_pgid(pgids).values())


def reap_now(members: Iterable[MemberProcess]) -> None:
    """Wait (bounded) for killed members and close their pidfds; used off the watcher."""
    deadline = time.monotonic() + REAP_ON_CLOSE_S
    for m in members:
        if m.pidfd is not None:
            _wait_readable(m.pidfd, deadline - time.monotonic())
            settle(m, waitid(m.pidfd))
            os.close(m.pidfd)
            m.pidfd = None
        elif m.popen is not None and m.popen.returncode is None:
            try:
                m.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                DISOWNED.append(m.popen)
