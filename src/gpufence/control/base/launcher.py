"""Per-member wrapper around the user command; one launcher per gang member.

Usage::

    python -m gpufence.control.base.launcher ATTEMPT_DIR --rank R [--catch N]...
        [--fence-parent PID] [--log-limit BYTES] [--cgroup DIR]...
        [--uid U --gid G [--groups G1,G2]] [--cwd DIR] [--pty-grace S] -- ARGV...

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
   log that is not a plain file) 125, and a line in ``rank-R.err``. With ``--log-limit`` it
   holds both logs to that many bytes while it waits (``logcap.py``: cut, with a note in the
   log and ``rank-R.logcap`` in its records).

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

ALWAYS_CAUGHT = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
"""Signals the launcher survives; ``--catch`` adds more (the executor's notice signal)."""

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_CONTAINED = 125

# Run by path (``python -I -S launcher.py``: no ``site``, the script's directory not on the path),
# the launcher finds its own package beside it; imported, it is already there.
if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from gpufence.control.base.logcap import POLL_S, LogCap  # noqa: E402
from gpufence.control.base.logcap import record as logcap_record  # noqa: E402
from gpufence.control.base.member_records import (  # noqa: E402
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
    pty_socket,
    read_text,
    records_dir,
    started_file,
    write_exit_record,
    write_lost_record,
)
from gpufence.control.base.supervisor import (  # noqa: E402
    Link,
    pending_signals,
    pending_stops,
    split,
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
        "[--cgroup DIR]... [--uid U --gid G [--groups G,...]] [--cwd DIR] [--pty-grace S] "
        "-- ARGV...",
        file=sys.stderr,
    )
    return 2


class SpawnFailure(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class SpawnLost(SpawnFailure):
    """The command never reached the member (a pre-started one whose executor went away
    between waking its launcher and handing its first process the command): nothing of the
    job ran. Recorded with no code, as a lost member, so the attempt is run again rather than
    settled by an exit code of ours: 0 would call a job that never ran done."""


def join_cgroup(directory: str) -> None:
    """Move this process into the cgroup ``directory`` (OSError if refused)."""
    fd = os.open(os.path.join(directory, "cgroup.procs"), os.O_WRONLY)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)


class Confine:
    """Where the user command runs: cgroup directories to join, the identity to take, then the
    working directory to enter (as that identity)."""

    def __init__(self) -> None:
        self.cgroups: list[str] = []
        self.uid: int | None = None
        self.gid: int | None = None
        self.groups: list[int] = []
        self.cwd: str | None = None
        self.terminal: tuple[str, float] | None = None
        """A pty job's (socket, grace): the child is its terminal host (``ptyhost.py``)."""

    def enter(self) -> None:
        """In the forked child, before exec: join every cgroup, drop to the job's user, then
        enter the working directory by its full path as that user, so a directory the user may
        not reach (the server's own, one under a 0700 home) is refused, not entered as root."""
        self.join_cgroups()
        self.become_user()

    def join_cgroups(self) -> None:
        for d in self.cgroups:
            try:
                join_cgroup(d)
            except OSError as exc:
                raise SpawnFailure(EXIT_NOT_CONTAINED, f"cannot join cgroup {d}: {exc}") from exc

    def become_user(self) -> None:
        """The job's groups, gid and uid, then its working directory entered as that user."""
        try:
            if self.gid is not None:
                os.setgroups(self.groups)
                os.setgid(self.gid)
            if self.uid is not None:
                os.setuid(self.uid)
        except OSError as exc:
            raise SpawnFailure(
                EXIT_NOT_CONTAINED, f"cannot switch to uid {self.uid} gid {self.gid}: {exc}"
            ) from exc
        if self.cwd is not None:
            try:
                os.chdir(self.cwd)
            except OSError as exc:
                raise SpawnFailure(
                    EXIT_NOT_CONTAINED,
                    f"cannot enter the working directory {self.cwd} as uid {os.getuid()}: "
                    f"{exc.strerror}",
                ) from exc


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


def _wait_or_fence(child: int, parent: int | None, cap: LogCap | None = None) -> bool:
    """Return when ``child`` has exited (not reaped); True if that is because process ``parent``
    (the node agent) died first and the group was stopped: SIGTERM, up to ``FENCE_GRACE_S`` for
    the child to exit, then SIGKILL to it (the caller records the exit, then kills what is left
    of the group). Both ends are pidfds: no polling, and no confusion with a reused pid. With a
    log ``cap`` it wakes every ``logcap.POLL_S`` to hold the logs to it."""
    fd = os.pidfd_open(child)
    watch: int | None = None
    try:
        if parent is not None:
            try:
                watch = os.pidfd_open(parent)
            except ProcessLookupError:  # already gone: fence at once
                return _fence(fd)
        ends = [fd] if watch is None else [fd, watch]
        while True:
            ready = select.select(ends, [], [], POLL_S if cap is not None else None)[0]
            if fd in ready:
                return False
            if ready:  # the parent died
                return _fence(fd)
            if cap is not None:
                cap.check()
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


class Options:
    """The launcher's command line: where its records go, which rank it runs, the command,
    which signals it survives, the process it is fenced to, and how the command is confined."""

    def __init__(self, attempt_dir: Path, command: list[str]) -> None:
        self.attempt_dir = attempt_dir
        self.command = command
        self.rank: int | None = None
        self.caught: set[signal.Signals] = set(ALWAYS_CAUGHT)
        self.fence_parent: int | None = None
        self.log_limit: int | None = None
        self.confine = Confine()

    def set(self, opt: str, value: str) -> str | None:
        """Take one ``--opt value``; what is wrong with it, if anything (ValueError: a value
        that is not a number where one is needed)."""
        if opt == "--rank":
            self.rank = int(value)
        elif opt == "--catch":
            self.caught.add(signal.Signals(int(value)))
        elif opt == "--fence-parent":
            self.fence_parent = int(value) or None
        elif opt == "--log-limit":
            self.log_limit = int(value) or None
        elif opt == "--cgroup":
            self.confine.cgroups.append(value)
        elif opt == "--uid":
            self.confine.uid = int(value)
        elif opt == "--gid":
            self.confine.gid = int(value)
        elif opt == "--groups":
            self.confine.groups = [int(g) for g in value.split(",") if g]
        elif opt == "--cwd":
            self.confine.cwd = value
        elif opt == "--pty-grace":
            self.confine.terminal = (str(pty_socket(self.attempt_dir)), float(value))
        else:
            return f"unknown option {opt}"
        return None


def parse(args: list[str]) -> Options | str:
    """The options of ``args`` (``ATTEMPT_DIR --opt value ... -- COMMAND...``), or what is
    wrong with them."""
    if "--" not in args:
        return "missing '--' before the command"
    split = args.index("--")
    opts, command = args[:split], args[split + 1 :]
    if not command:
        return "empty command"
    if not opts:
        return "missing ATTEMPT_DIR"
    parsed = Options(Path(opts.pop(0)), command)
    while opts:
        opt = opts.pop(0)
        if not opts:
            return f"option {opt} needs a value"
        value = opts.pop(0)
        try:
            problem = parsed.set(opt, value)
        except ValueError:
            return f"bad value for {opt}: {value!r}"
        if problem is not None:
            return problem
    if parsed.rank is None:
        return "missing --rank"
    return parsed


def main(
    argv: list[str] | None = None,
    env: dict[str, str] | None = None,
    spawn: Spawner | None = None,
    keep_fds: Sequence[int] = (),
    link: Link | None = None,
    split_here: bool = True,
) -> int:
    """Run one member (see the module docstring); ``env`` is the user command's environment
    (default: the launcher's own, as when run by path; the fork server passes the job's);
    ``spawn`` starts it (default: fork now), using descriptors ``keep_fds``. The member's
    supervisor (``supervisor.py``) is split off here unless not ``split_here`` (a pre-started
    member, whose supervisor is made before its job's process: ``link`` is the way to it,
    None when it has none)."""
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
    _close_fds((*keep_fds, *(link.fds() if link is not None else ())))
    if split_here:
        link = split((attempt_dir, rank))  # from here on: the supervisor's child
    elif link is not None:
        link.tell(attempt_dir, rank)
    supervisor = os.getppid() if link is not None else None
    _record_pid(attempt_dir, rank, supervisor or os.getpid())

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
        parsed, job_env, spawn or _spawn, out_fd, err_fd, (supervisor, early_from)
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
    out_fd: int,
    err_fd: int,
    supervisors: tuple[int | None, int | None],
) -> tuple[int, bool | None, str | None, bool]:
    """Start the command and wait for it: (exit code, whether a stop reached it first (None:
    it never ran), why it was lost (None: it was not), whether the fence parent died). Closes
    both log descriptors."""
    assert o.rank is not None
    supervisor, early_from = supervisors  # (for stops, for signals before the command ran)
    fenced = False
    stop_reached: bool | None = None  # the command never ran: no stop could reach it
    lost: str | None = None
    try:
        child = spawn(o.command, job_env, out_fd, err_fd, o.confine)
    except SpawnLost as exc:
        code, lost = exc.code, exc.message
        with contextlib.suppress(OSError):
            os.write(err_fd, f"gpufence launcher: {exc.message}\n".encode())
    except SpawnFailure as exc:
        code = exc.code
        with contextlib.suppress(OSError):  # a full disk must not cost the exit record
            os.write(err_fd, f"gpufence launcher: {exc.message}\n".encode())
    else:
        # when the command exists (exec done): the GPU's hand-off ends here, whatever the
        # command then spends on its own start-up
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
        cap = LogCap((out_fd, err_fd), o.log_limit) if o.log_limit is not None else None
        if o.fence_parent is not None or cap is not None:
            fenced = _wait_or_fence(child, o.fence_parent, cap)
        _, status = os.waitpid(child, 0)  # PEP 475: retried after _survive runs
        code = os.waitstatus_to_exitcode(status)
        stop_reached = fenced or _stop_reached(supervisor)
        if cap is not None:
            cap.check()  # what it wrote last
            if cap.hit:
                logcap_record(logcap_file(o.attempt_dir, o.rank), cap)
    finally:
        os.close(out_fd)
        os.close(err_fd)
    return code, stop_reached, lost, fenced


if __name__ == "__main__":
    sys.exit(main())
