"""Per-member wrapper around the user command; one launcher per gang member.

Usage::

    python -m gpufence.control.base.launcher ATTEMPT_DIR --rank R [--catch N]...
        [--fence-parent PID] [--log-limit BYTES] [--cgroup DIR]...
        [--uid U --gid G [--groups G1,G2]] [--cwd DIR] [--runtime-monitor 1] [--pty-grace S]
        -- ARGV...

(The Ray node agent runs this file by path with ``python -I -S``: it imports only the standard
library and its record formats (``member_records.py``, standard library only, found beside it),
so it needs neither ``gpufence`` installed on the path nor ``site``, and starts ~20 ms sooner. The
local executor's fork server (``containment/forkserver.py``) has it imported already and calls
``main`` in a forked child: no interpreter start-up at all.)

The launcher leads the member's process group (the executor starts it in a new session, the
fork server in a new process group). It

1. survives SIGTERM, SIGINT, SIGUSR1 and every ``--catch`` signal (handlers that only note
   them, which ``exec`` resets for the user command): a signal to the group reaches the
   command, the launcher lives on to record the exit. The executor starts it with those
   signals *blocked*; it forwards any that came before the command existed, then unblocks
   them, so an early stop is not lost;
2. splits off the member's supervisor (``supervisor.py``: the process it was started as stays
   above it, records the job's exit if the launcher is killed, and is what ``rank-R.pid``
   names), then writes ``rank-R.pid`` (``pid``, ``start_time`` = field 22 of
   ``/proc/<pid>/stat``, the guard against pid reuse; ``rank-R.started`` names the
   launcher). Its records (``.pid``, ``.started``, ``.exit``) go to ``ATTEMPT_DIR.records``
   (``records_dir``), the control plane's, not the job user's attempt directory: a record the
   job could forge would name the process group a restarted control plane signals and kills;
3. runs the command as its child, stdout/stderr appended to ``rank-R.out`` / ``rank-R.err``
   (``open_log``: no link the job planted is followed). Between fork and exec the child joins
   every ``--cgroup`` directory (no process of the job ever runs outside it), then switches to
   ``--gid`` / ``--groups`` / ``--uid``, then enters ``--cwd`` as that user. The launcher stays
   outside the cgroup with the control plane's identity: killing the cgroup never loses the
   exit record;
4. waits, writes ``rank-R.exit`` (``code``, ``ended_unix``; negative code = killed by that
   signal; ``stop``: whether a stop, SIGTERM or SIGINT, had reached the group before the command
   exited: an attempt whose members all exited 0 with no stop reaching them finished its work,
   and is done even if the control plane had just decided to stop it) and exits with the code
   (128 + signal for a signal death). A command that cannot be executed gets 127 (not found)
   or 126, one that cannot be contained (cgroup, user switch or working directory refused, a
   log that is not a plain file) 125, and a line in ``rank-R.err``. With ``--log-limit`` the
   command's stdout and stderr are pipes that a log pump it forks copies into the logs, never
   past that many bytes (``logcap.py``: cut, with a note in the log and ``rank-R.logcap`` in
   its records); the exit is recorded once the pump has copied the last of it.

The exit record survives a full or failing data disk (``write_exit_record``), or a completed job
would run again after a restart: the executor *reserves* it at spawn (``EXIT_RESERVED`` bytes,
while there is room), the launcher overwrites that in place and fsyncs it; failing that
(read-only, I/O error) it spools it to ``$GPUFENCE_EXIT_SPOOL`` (default
``/dev/shm/gpufence-exits``, another file system; only while that is a 0700 directory of the
control plane's uid, ``private_spool``, so no job can forge records there) and, failing that
too, retries while it lives: the member looks alive, so nothing is run in its place.
``$GPUFENCE_EXIT_SPOOL`` and ``$GPUFENCE_FAILPOINTS`` (``LAUNCHER_ENV``) are the launcher's own,
never passed on to the job.

With ``--fence-parent PID`` (the Ray node agent's pid) the member does not outlive that process:
if it dies (the control plane has declared the member lost and runs the job again elsewhere), the
launcher stops the group itself (SIGTERM, 5 s, SIGKILL, and SIGKILL to whatever else is in its
``--cgroup``). The local executor does not use it: its jobs outlive a restart and are adopted.

With ``--pty-grace S`` (a pty job) the child is the job's terminal host (``ptyhost.py``): in the
cgroups as the control plane's user, it forks the command on its terminal, confined as above.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# Run by path (``python -I -S launcher.py``: no ``site``, the script's directory not on the path),
# the launcher finds its own package beside it; imported, it is already there.
if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

# (the fork server, prestart and the executors take these from here: the launcher's interface)
from gpufence.control.base.launch_args import (
    ALWAYS_CAUGHT as ALWAYS_CAUGHT,
)
from gpufence.control.base.launch_args import (
    EXIT_NOT_CONTAINED as EXIT_NOT_CONTAINED,
)
from gpufence.control.base.launch_args import (
    EXIT_NOT_EXECUTABLE as EXIT_NOT_EXECUTABLE,
)
from gpufence.control.base.launch_args import (
    EXIT_NOT_FOUND,
    Options,
    SpawnFailure,
    SpawnLost,
    parse,
)
from gpufence.control.base.launch_args import Confine as Confine
from gpufence.control.base.launch_args import join_cgroup as join_cgroup
from gpufence.control.base.launch_args import log_limit_of as log_limit_of
from gpufence.control.base.logcap import Pump
from gpufence.control.base.member_records import (
    LAUNCHER_ENV,
    STOPS,
    atomic_write,
    err_file,
    logcap_file,
    open_log,
    out_file,
    pid_file,
    pid_record,
    proc_start_time,
    read_text,
    records_dir,
    started_file,
    write_exit_record,
    write_lost_record,
)
from gpufence.control.base.supervisor import (
    Link,
    outlived_child,
    pending_signals,
    pending_stops,
    split,
    subreaper,
)


def _failpoint(name: str) -> None:
    """``$GPUFENCE_FAILPOINTS`` for the launcher's own points (see control/failpoints.py;
    only ``crash`` applies here: the launcher imports nothing of gpufence's but its records)."""
    for item in os.environ.get("GPUFENCE_FAILPOINTS", "").split(","):
        if item.strip().split("=")[0] == name:
            os.kill(os.getpid(), signal.SIGKILL)


def _usage(msg: str) -> int:
    print(f"gpufence launcher: {msg}", file=sys.stderr)
    print(
        "usage: launcher ATTEMPT_DIR --rank R [--catch SIGNUM]... [--fence-parent PID] "
        "[--log-limit BYTES] "
        "[--cgroup DIR]... [--uid U --gid G [--groups G,...]] [--cwd DIR] "
        "[--runtime-monitor 1] [--pty-grace S] -- ARGV...",
        file=sys.stderr,
    )
    return 2


def _spawn(
    command: list[str],
    env: dict[str, str],
    out_fd: int,
    err_fd: int,
    confine: Confine,
) -> int:
    """fork + exec the user command with clean signal state (``SpawnFailure`` on failure). Not
    ``posix_spawn``: glibc leaves its real-time signals ignored in the child, which survives
    ``exec``; the launcher is single-threaded, so ``fork`` is safe."""
    r, w = os.pipe()  # close-on-exec: EOF tells the parent that exec succeeded
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child side, ends in exec or _exit
        os.close(r)
        exec_child(command, env, out_fd, err_fd, confine, w)
    os.close(w)
    return await_exec(pid, r, command)


def exec_child(
    command: list[str], env: dict[str, str], out_fd: int, err_fd: int, confine: Confine, report: int
) -> None:  # pragma: no cover - runs in the child, ends in exec or _exit
    """The child's side: logs on 1/2, into the cgroup and the job's identity, default signal
    dispositions, exec. A failure is written to ``report`` (a close-on-exec pipe). A pty job's
    child is its terminal host instead, which comes back here for the command (``ptyhost``)."""
    try:
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        if confine.terminal is not None:
            # the host's imports are paid by pty jobs only, after the fork
            from gpufence.control.base import ptyhost

            ptyhost.host_job(command, env, confine, report, exec_child)  # ends in _exit
        confine.enter()
        # every disposition back to default: an ignored one (SIGHUP under nohup, SIGPIPE
        # from Python) would survive exec and change how the job reacts to signals
        for sig in signal.valid_signals():
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                with contextlib.suppress(OSError, ValueError):
                    signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        os.execvpe(command[0], command, env)
    except BaseException as exc:
        if isinstance(exc, SpawnFailure):
            kind, why = "c", exc.message
        else:
            kind = "n" if isinstance(exc, FileNotFoundError) else "x"
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
        os.write(report, f"{kind}{why}".encode(errors="replace"))
    finally:
        os._exit(EXIT_NOT_FOUND)


def await_exec(pid: int, report: int, command: list[str]) -> int:
    """The parent's side: ``pid`` once it has exec'd (EOF on ``report``), else SpawnFailure."""
    with os.fdopen(report, "rb") as fh:
        text = fh.read().decode(errors="replace")
    if not text:
        return pid
    os.waitpid(pid, 0)
    if text[0] == "c":
        raise SpawnFailure(EXIT_NOT_CONTAINED, text[1:])
    if text[0] == "n":
        raise SpawnFailure(EXIT_NOT_FOUND, f"command not found: {command[0]!r}: {text[1:]}")
    if text[0] == "l":
        raise SpawnLost(EXIT_NOT_EXECUTABLE, text[1:])
    raise SpawnFailure(EXIT_NOT_EXECUTABLE, f"cannot execute {command[0]!r}: {text[1:]}")


FENCE_GRACE_S = 5.0


def _wait_or_fence(child: int, parent: int) -> bool:
    """Return when ``child`` has exited (not reaped); True if that is because process ``parent``
    (the node agent) died first and the group was stopped: SIGTERM, up to ``FENCE_GRACE_S`` for
    the child to exit, then SIGKILL to it (the caller records the exit, then kills what is left
    of the group). Both ends are pidfds: no polling, and no confusion with a reused pid."""
    fd = os.pidfd_open(child)
    watch: int | None = None
    try:
        try:
            watch = os.pidfd_open(parent)
        except ProcessLookupError:  # already gone: fence at once
            return _fence(fd)
        ready = select.select([fd, watch], [], [])[0]
        return False if fd in ready else _fence(fd)
    finally:
        if watch is not None:
            os.close(watch)
        os.close(fd)


def _fence(fd: int) -> bool:
    """Stop the group whose command is pidfd ``fd``: SIGTERM, then SIGKILL after the grace."""
    os.killpg(0, signal.SIGTERM)  # the group: the command and its children (we survive)
    if not select.select([fd], [], [], FENCE_GRACE_S)[0]:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    return True


def _kill_cgroup(dirs: list[str], limit_s: float = FENCE_GRACE_S) -> None:
    """SIGKILL everything in the member's cgroup until it is empty or ``limit_s`` passed."""
    if not dirs:
        return
    procs = os.path.join(dirs[0], "cgroup.procs")
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            with open(procs, encoding="ascii") as fh:
                pids = [int(x) for x in fh.read().split()]
        except (OSError, ValueError):
            return
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def _wait(child: int, parent: int | None) -> tuple[int, bool]:
    """Wait for and reap ``child``: (its exit code, whether the fence parent died first)."""
    fenced = _wait_or_fence(child, parent) if parent is not None else False
    _, status = os.waitpid(child, 0)  # PEP 475: retried after _survive runs
    return os.waitstatus_to_exitcode(status), fenced


_seen: set[int] = set()
"""The caught signals that reached this launcher (``_survive``)."""


def _survive(signum: int, _frame: object) -> None:
    """Survive the signal (the user command in the same group receives it too), noting it."""
    _seen.add(signum)


def _stop_reached(supervisor: int | None) -> bool:
    """Whether a stop signal reached the group before the command's exit was reaped.

    The control plane signals the whole group at once (killpg): a command that exits *because*
    of a stop got it no earlier than this launcher, in which it was pending from then on. It is
    taken by the C-level handler at the latest when ``waitpid`` returns, and this call (a
    Python function: the interpreter runs pending handlers on entering it) runs ``_survive``
    first; ``sigpending`` covers a stop that came while the signals were still blocked. With
    containment the executor signals the supervisor (before the cgroup), which keeps it
    pending: ``supervisor.pending_stops``."""
    if _seen & STOPS or signal.sigpending() & STOPS:
        return True
    return supervisor is not None and pending_stops(supervisor)


Spawner = Callable[[list[str], dict[str, str], int, int, Confine], int]
"""``(command, env, out_fd, err_fd, confine) -> pid`` or ``SpawnFailure``: ``_spawn`` forks now, a
pre-started member (``prestart.py``) uses a child forked (and put in its cgroup) ahead of time."""


def _close_fds(keep: Sequence[int]) -> None:
    low = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def main(
    argv: list[str] | None = None,
    env: dict[str, str] | None = None,
    spawn: Spawner | None = None,
    keep_fds: Sequence[int] = (),
    link: Link | None = None,
    split_here: bool = True,
    job_pipes: tuple[int, int] | None = None,
) -> int:
    """Run one member (see the module docstring); ``env`` is the user command's environment
    (default: the launcher's own, as when run by path; the fork server passes the job's);
    ``spawn`` starts it (default: fork now), using descriptors ``keep_fds``. The member's
    supervisor (``supervisor.py``) is split off here unless not ``split_here`` (a pre-started
    member, whose supervisor is made before its job's process: ``link`` is the way to it,
    None when it has none; ``job_pipes``: the read ends of the pipes its job's process writes
    its output into, when the member has a log limit)."""
    args = list(sys.argv[1:] if argv is None else argv)
    job_env = dict(os.environ if env is None else env)
    for name in LAUNCHER_ENV:  # ours (run by path, the job's env is ours), never the job's
        job_env.pop(name, None)
    parsed = parse(args)
    if isinstance(parsed, str):
        return _usage(parsed)
    attempt_dir, rank = parsed.attempt_dir, parsed.rank
    assert rank is not None  # parse says "missing --rank" otherwise

    # Blocked first (the executor already starts us with them blocked; this covers a launcher run
    # by hand), then survivable: a pending one is forwarded once the user command exists.
    signal.pthread_sigmask(signal.SIG_BLOCK, parsed.caught)
    _seen.clear()  # a forked launcher (the fork server's child) starts with none seen
    for sig in parsed.caught:
        signal.signal(sig, _survive)

    # descriptors the control plane leaked to us (not close-on-exec) must not reach the command
    _close_fds((*keep_fds, *(link.fds() if link is not None else ()), *(job_pipes or ())))
    if split_here:
        link = split((attempt_dir, rank))  # from here on: the supervisor's child
    elif link is not None:
        link.tell(attempt_dir, rank)
    supervisor = os.getppid() if link is not None else None
    _record_pid(attempt_dir, rank, supervisor or os.getpid())
    if parsed.runtime_monitor:
        subreaper()  # the job's command outlives its runtime's monitor as our child

    out_fd = -1
    try:
        out_fd = open_log(out_file(attempt_dir, rank))
        err_fd = open_log(err_file(attempt_dir, rank))
    except OSError as exc:  # the job's directory holds something we must not write through
        if out_fd >= 0:
            os.close(out_fd)
        print(f"gpufence launcher: {exc}", file=sys.stderr)
        write_exit_record(attempt_dir, rank, EXIT_NOT_CONTAINED, time.time())
        _done(link, EXIT_NOT_CONTAINED)
        return EXIT_NOT_CONTAINED
    # a pre-started member's job process was in its cgroup before the executor knew of it:
    # nothing sent to the member can have missed it, so there is no supervisor's to forward
    early_from = supervisor if split_here else None
    code, stop_reached, lost, fenced = _run(
        parsed, job_env, spawn or _spawn, (out_fd, err_fd), (supervisor, early_from), job_pipes
    )
    if lost is not None:
        write_lost_record(attempt_dir, rank, lost, time.time())
        _done(link, code)
        return code
    write_exit_record(attempt_dir, rank, code, time.time(), stop_reached)
    _failpoint("launcher.after-exit-record")
    if fenced:  # nobody is left to clean up after us: the rest of the group goes too (and we)
        _kill_cgroup(parsed.confine.cgroups)
        os.killpg(0, signal.SIGKILL)
    status = code if code >= 0 else 128 - code
    _done(link, status)
    return status


def _done(link: Link | None, code: int) -> None:
    if link is not None:
        link.done(code)


def _record_pid(attempt_dir: Path, rank: int, keeper: int) -> None:
    """``rank-R.pid``: the pid and start time (the guard against pid reuse) of the member's
    keeper: its supervisor (the process the executor started, leader of the member's group),
    else this launcher."""
    record = pid_record(keeper, proc_start_time(keeper) or 0)
    # written already by whoever forked us (the fork server): replacing a file by rename costs
    # ext4 a data flush (auto_da_alloc, ~2 ms on a busy disk), right on the GPU hand-off. On a
    # full disk ours may fail, which is fine: the executor wrote one at the spawn
    if read_text(pid_file(attempt_dir, rank)) != record:
        with contextlib.suppress(OSError):
            with contextlib.suppress(FileExistsError):  # the executor makes it; by hand, we do
                os.mkdir(records_dir(attempt_dir), 0o700)
            atomic_write(pid_file(attempt_dir, rank), record)


def _run(
    o: Options,
    job_env: dict[str, str],
    spawn: Spawner,
    logs: tuple[int, int],
    supervisors: tuple[int | None, int | None],
    job_pipes: tuple[int, int] | None = None,
) -> tuple[int, bool | None, str | None, bool]:
    """Start the command and wait for it: (exit code, whether a stop reached it first (None:
    it never ran), why it was lost (None: it was not), whether the fence parent died). Closes
    both log descriptors. With a log limit the command writes into pipes a log pump copies
    (``logcap.py``): ``job_pipes`` are their read ends when the command's process was made
    with them already (a pre-started member), else they are made here."""
    assert o.rank is not None
    out_fd, err_fd = logs
    pump = None
    if o.log_limit is not None:
        pump = Pump(logs, o.log_limit, logcap_file(o.attempt_dir, o.rank), job_pipes)
    fenced = False
    stop_reached: bool | None = None  # the command never ran: no stop could reach it
    lost: str | None = None
    try:
        ends = pump.writes if pump is not None and pump.writes else logs  # (pre-started: unused)
        child = spawn(o.command, job_env, ends[0], ends[1], o.confine)
    except SpawnLost as exc:
        code, lost = exc.code, exc.message
        _say_failure(err_fd, exc.message, pump)
    except SpawnFailure as exc:
        code = exc.code
        _say_failure(err_fd, exc.message, pump)
    else:
        _started(o, child, job_env, supervisors)
        if pump is not None:  # the job's first output waits in the pipe meanwhile
            pump.start(o.confine.cgroups, _close_fds)
        code, fenced = _wait(child, o.fence_parent)
        pump_pid = pump.pid if pump is not None else None
        inner = outlived_child(code, pump_pid) if o.runtime_monitor else None
        if inner is not None:
            code, fenced_inner = _wait(inner, o.fence_parent)
            fenced = fenced or fenced_inner
        stop_reached = fenced or _stop_reached(supervisors[0])
        if pump is not None:
            pump.finish()  # what it wrote last is in the log before the exit record
    finally:
        os.close(out_fd)
        os.close(err_fd)
    return code, stop_reached, lost, fenced


def _say_failure(err_fd: int, message: str, pump: Pump | None) -> None:
    """Why the command never ran, in its stderr log (a full disk must not cost the exit
    record)."""
    if pump is not None:
        pump.abandon()
    with contextlib.suppress(OSError):
        os.write(err_fd, f"gpufence launcher: {message}\n".encode())


def _started(
    o: Options, child: int, job_env: dict[str, str], supervisors: tuple[int | None, int | None]
) -> None:
    """The command exists (exec done): record it, pass on the signals that came before it,
    then let later ones reach our no-op handlers."""
    assert o.rank is not None
    early_from = supervisors[1]  # signals before the command ran went to this supervisor
    # the GPU's hand-off ends here, whatever the command then spends on its own start-up
    started = {
        "pid": child,
        "exec_unix": time.time(),
        "devices": job_env.get("CUDA_VISIBLE_DEVICES", ""),
        "fence_parent": o.fence_parent,
        # while the supervisor is gone (killed), the member lives on in this launcher
        "launcher": os.getpid(),
        "launcher_start": proc_start_time(os.getpid()),
    }
    with contextlib.suppress(OSError):  # informational (hand-off timing): may be lost
        atomic_write(started_file(o.attempt_dir, o.rank), json.dumps(started) + "\n")
    # anything sent to the group before the command existed reached only us: pass it on
    early = signal.sigpending() & o.caught
    if early_from is not None:  # signals the executor sent the supervisor meanwhile
        early |= {signal.Signals(s) for s in pending_signals(early_from) if s in o.caught}
    for sig in sorted(early):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, sig)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, o.caught)  # later ones: our no-op handlers


if __name__ == "__main__":
    sys.exit(main())
