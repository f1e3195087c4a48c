"""A member's supervisor: the process above its launcher, so that killing the launcher does not
lose how the job ended.

Only a process's parent learns its exit status. The launcher is the parent of the job's first
process and writes ``rank-R.exit``; if the launcher itself is killed (``kill -9``, the OOM
killer) while the control plane is down, the job runs on, ends, and nobody records it: the
attempt would read as lost and run again although it completed. So the process the executor
starts (the one ``rank-R.pid`` names, the leader of the member's process group) first ``split``s:

* its child goes on as the launcher (forks the job, waits, writes the exit record);
* it stays as the supervisor: a child subreaper (``PR_SET_CHILD_SUBREAPER``), so when the
  launcher dies the job's process is re-parented to it, not to init. It waits for the launcher;
  if that ended by a signal without an exit record, it waits for the job's process itself (its
  pid from ``rank-R.started``) and writes the record. Only if the launcher had already reaped
  the job is the exit truly unknown: then nothing is written and the attempt reads as lost.

The supervisor blocks every signal and never takes one: the executor signals it (with
containment, before the member's cgroup), so its *pending* set says whether a stop reached the
member, which the launcher reads from ``/proc/<supervisor>/status`` (``pending_stops``) as well
as its own; like the container runtimes' monitor process, it stays outside the job's cgroup, so
killing the cgroup never kills it, and runs as the control plane's user, so the job cannot
signal it. It exits with the launcher's code, as soon as the launcher ends normally.

Standard library only (plus ``member_records``): the launcher may run by path with ``-I -S``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import time
from pathlib import Path

from gpufence.control.base.member_records import (
    STOPS,
    exit_file,
    read_text,
    spool_file,
    started_file,
    write_exit_record,
)

PR_SET_CHILD_SUBREAPER = 36
ORPHAN_REAP_S = 1.0
"""How often the supervisor reaps what the job orphaned while the launcher runs."""
_ALL = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}


def _subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False  # not Linux: the launcher alone records (as before)


def subreaper() -> bool:
    """Make this process a child subreaper: orphans of its descendants become its children."""
    return _subreaper()


def outlived_child(code: int, pump: int | None = None) -> int | None:
    """The job's process that outlived a container runtime's monitor, now our child.

    The runtime's first process (bwrap's monitor) is in the member's cgroup, so the signals
    sent to the member -- a stop, a notice -- reach it too, and it dies of them where the job's
    command may well catch them (a checkpoint on SIGTERM or SIGUSR1). Its exit is then not the
    job's: the job runs on. As a child subreaper (``subreaper``, set before the spawn) the
    launcher inherits the monitor's one child, the job's command, and waits for it and records
    *its* exit. None when the monitor ended on its own (it reaped the command and
    exits with its code, 128 + N for a signal N) or left no child. ``pump``: the launcher's
    log pump (``logcap.py``), its own child, never the job's."""
    if code >= 0:
        return None
    try:
        with open(f"/proc/self/task/{os.getpid()}/children", encoding="ascii") as fh:
            kids = [int(p) for p in fh.read().split() if int(p) != pump]
    except (OSError, ValueError):
        return None
    return kids[0] if len(kids) == 1 else None


class Link:
    """The launcher's two pipes to its supervisor: ``info`` (where the records are: read only
    if the launcher dies, so telling it wakes nobody on the hand-off) and ``done`` (the exit is
    recorded: the supervisor, which the executor watches, exits at once with the code, without
    waiting for the launcher's own exit)."""

    def __init__(self, info: int, done: int) -> None:
        self.info = info
        self.done_fd = done

    def fds(self) -> tuple[int, int]:
        return self.info, self.done_fd

    def tell(self, attempt_dir: Path, rank: int) -> None:
        _say(self.info, {"dir": str(attempt_dir), "rank": rank})

    def done(self, code: int) -> None:
        _say(self.done_fd, {"exit": code})


def _say(fd: int, msg: dict[str, object]) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, json.dumps(msg).encode() + b"\n")


def split(where: tuple[Path, int] | None = None) -> Link | None:
    """Fork: the child returns (it goes on as the launcher) with its ``Link``, the parent
    becomes the supervisor and never returns. ``where`` (attempt dir, rank) if known now, else
    the launcher ``tell``s it. None if no supervisor could be made (no subreaper, fork
    failed): the launcher goes on alone."""
    if not _subreaper():
        return None
    (ir, iw), (dr, dw) = os.pipe(), os.pipe()
    try:
        pid = os.fork()
    except OSError:
        for fd in (ir, iw, dr, dw):
            os.close(fd)
        return None
    if pid == 0:
        os.close(ir)
        os.close(dr)
        return Link(iw, dw)
    os.close(iw)
    os.close(dw)
    code = 0
    try:
        code = supervise(pid, ir, dr, where)
    finally:
        os._exit(code & 0xFF)


def _messages(fd: int) -> list[dict[str, object]]:
    """What is in the pipe now (non-blocking), as messages."""
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := os.read(fd, 65536):
            data += chunk
    out = []
    for line in data.split(b"\n"):
        with contextlib.suppress(ValueError):
            msg = json.loads(line)
            if isinstance(msg, dict):
                out.append(msg)
    return out


def _where(info: int, where: tuple[Path, int] | None) -> tuple[Path, int] | None:
    for msg in _messages(info):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            where = Path(str(msg["dir"])), int(str(msg["rank"]))
    return where


def supervise(launcher: int, info: int, done: int, where: tuple[Path, int] | None) -> int:
    """Wait for the launcher to say it recorded the exit, or to die (reaping whatever the job
    leaves orphaned meanwhile); if it died first, record the job's exit in its place. The exit
    code."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _ALL)
    pidfd = os.pidfd_open(launcher)
    status: int | None = None
    watch = [pidfd, done]
    while status is None:
        ready = select.select(watch, [], [], ORPHAN_REAP_S)[0]
        if done in ready:
            said = [m["exit"] for m in _messages(done) if "exit" in m]
            if said:  # recorded: exit now (the launcher's own exit need not be awaited)
                return int(str(said[-1]))
            watch = [pidfd]  # EOF: the launcher is gone without a word
        status = _reap(launcher)
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return code  # the launcher ended itself, having recorded what there was to record
    where = _where(info, where)
    if where is None or _recorded(*where):
        return 128 - code
    return _take_over(*where, killed=code)


def _reap(launcher: int) -> int | None:
    """Reap our exited children (orphans the job left, re-parented to us); the launcher's wait
    status if it is among them."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if pid == 0:
            return None
        if pid == launcher:
            return status


def _recorded(attempt_dir: Path, rank: int) -> bool:
    for path in (exit_file(attempt_dir, rank), spool_file(attempt_dir, rank)):
        with contextlib.suppress(ValueError, AttributeError):
            rec = json.loads(read_text(path) or "null")
            if rec is not None and (rec.get("code") is not None or "lost" in rec):
                return True
    return False


def _take_over(attempt_dir: Path, rank: int, killed: int) -> int:
    """The launcher was killed: wait for the job's first process, now our child, and record
    its exit. Nothing is recorded when it is not ours (the launcher had reaped it already, or
    it never started): then how it ended is unknown."""
    try:
        child = int(json.loads(read_text(started_file(attempt_dir, rank)) or "{}")["pid"])
        _, status = os.waitpid(child, 0)
    except (ValueError, KeyError, TypeError, ChildProcessError):
        return 128 - killed
    code = os.waitstatus_to_exitcode(status)
    stop = bool(signal.sigpending() & STOPS)
    write_exit_record(attempt_dir, rank, code, time.time(), stop)
    return code if code >= 0 else 128 - code


def pending_stops(pid: int) -> bool:
    """Whether a stop (SIGTERM, SIGINT) is pending at process ``pid`` (the supervisor, which
    blocks and keeps every signal it is sent): ``/proc/<pid>/status``'s SigPnd and ShdPnd."""
    return bool(pending_signals(pid) & STOPS)


def pending_signals(pid: int) -> set[int]:
    text = read_text(Path(f"/proc/{pid}/status")) or ""
    mask = 0
    for line in text.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            with contextlib.suppress(ValueError):
                mask |= int(line.split(":", 1)[1].strip(), 16)
    return {int(sig) for sig in _ALL if mask & (1 << (int(sig) - 1))}
