"""Per-member wrapper around the user command; one launcher per gang member.

Usage::

    python -m gpufence.control.executors.launcher ATTEMPT_DIR --rank R [--catch N]...
        [--fence-parent PID] -- ARGV...

(``LocalExecutor`` runs this file by path with ``python -I -S``: it imports only the standard
library, so it needs neither ``gpufence`` on the path nor ``site``, and starts ~20 ms sooner.)

The launcher is the leader of the member's process group (the executor starts it in a new
session). It

1. ignores SIGTERM, SIGINT, SIGUSR1 and every ``--catch`` signal itself (no-op handlers, which
   ``exec`` resets to the default for the user command), so a signal sent to the group reaches
   the user command while the launcher lives on to record the exit;
2. writes ``rank-R.pid`` (JSON: ``pid``, ``start_time`` = field 22 of ``/proc/<pid>/stat``, the
   guard against pid reuse) atomically;
3. runs the user command as its child in the same process group, stdout/stderr appended to
   ``rank-R.out`` / ``rank-R.err``;
4. waits, writes ``rank-R.exit`` (JSON: ``code``, ``ended_unix``; negative code = killed by that
   signal) and exits with the code (128 + signal for a signal death).

The exit record must survive a full or failing data disk, or a completed job would run again
after a restart (``write_exit_record``): the executor *reserves* it at spawn (a placeholder of
``EXIT_RESERVED`` bytes, written while there is room), the launcher overwrites that in place
(no new block is needed on a full disk) and fsyncs it; if that fails too (read-only, I/O error)
it spools the record to ``$GPUFENCE_EXIT_SPOOL`` (default ``/dev/shm/gpufence-exits``, a
separate file system) and, if even that fails, keeps retrying while it lives: the launcher stays
the member's process-group leader, so the member looks alive and nothing is run in its place.

With ``--fence-parent PID`` (the Ray node agent passes its own pid) the member does not outlive
that process: if it dies (the node agent is gone, so the control plane has declared
the member lost and will run the job again elsewhere), the launcher stops the group itself
(SIGTERM, 5 s, then SIGKILL), so a requeued job never runs twice. The local executor does not
use it: there the jobs must survive a control-plane restart and be adopted.

A command that cannot be executed gets code 127 (not found) or 126 (not executable) and a
message in ``rank-R.err``. The executor starts the launcher with the caught signals *blocked*;
the launcher forwards any that arrived before the user command existed, then unblocks them, so
a stop or notice sent right after start is not lost.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import signal
import sys
import time
from pathlib import Path

ALWAYS_CAUGHT = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
"""Signals the launcher survives; ``--catch`` adds more (the executor's notice signal)."""

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126


def pid_file(attempt_dir: Path, rank: int) -> Path:
    return attempt_dir / f"rank-{rank}.pid"


def exit_file(attempt_dir: Path, rank: int) -> Path:
    return attempt_dir / f"rank-{rank}.exit"


def out_file(attempt_dir: Path, rank: int) -> Path:
    return attempt_dir / f"rank-{rank}.out"


def err_file(attempt_dir: Path, rank: int) -> Path:
    return attempt_dir / f"rank-{rank}.err"


def atomic_write(path: Path, text: str, fsync: bool = False) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def pid_record(pid: int, start_time: int) -> str:
    """Content of ``rank-R.pid`` (hand-written JSON: the launcher does not import ``json``)."""
    return f'{{"pid": {int(pid)}, "start_time": {int(start_time)}}}\n'


def exit_record(code: int, ended_unix: float) -> str:
    """Content of ``rank-R.exit``."""
    return f'{{"code": {int(code)}, "ended_unix": {float(ended_unix)!r}}}\n'


EXIT_RESERVED = 256
"""Bytes reserved for ``rank-R.exit`` at spawn; the record is overwritten into them."""
SPOOL_ENV = "GPUFENCE_EXIT_SPOOL"
DEFAULT_SPOOL = "/dev/shm/gpufence-exits"


def reserved_exit_record() -> str:
    """The placeholder (``code`` null: "not exited yet") that reserves the record's blocks."""
    return '{"code": null}'.ljust(EXIT_RESERVED - 1) + "\n"


def spool_file(attempt_dir: Path, rank: int) -> Path:
    """Where a record goes when the attempt directory takes no writes (outside the data disk)."""
    key = hashlib.sha256(str(attempt_dir.absolute()).encode()).hexdigest()[:32]
    return Path(os.environ.get(SPOOL_ENV) or DEFAULT_SPOOL) / f"{key}-rank-{rank}.exit"


def _overwrite_reserved(path: Path, text: str) -> None:
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_size != EXIT_RESERVED or len(data) > EXIT_RESERVED:
            raise OSError(f"{path} is not a reserved exit record")
        os.pwrite(fd, data.ljust(EXIT_RESERVED - 1) + b"\n", 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_exit_record(attempt_dir: Path, rank: int, code: int, ended_unix: float) -> str:
    """Record how the member ended, whatever state the data disk is in; returns where.

    In order: into the reserved record in place, as a new file (atomic), to the spool; if none
    works, wait and try again (with backoff, up to 5 s apart) for as long as it takes."""
    text = exit_record(code, ended_unix)
    path = exit_file(attempt_dir, rank)
    tries = 0
    while True:
        with contextlib.suppress(OSError):
            _overwrite_reserved(path, text)
            return "reserved"
        with contextlib.suppress(OSError):
            atomic_write(path, text, fsync=True)
            return "file"
        with contextlib.suppress(OSError):
            spool = spool_file(attempt_dir, rank)
            spool.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            atomic_write(spool, text, fsync=True)
            return "spool"
        time.sleep(min(5.0, 0.05 * 2**tries))
        tries += 1


def _failpoint(name: str) -> None:
    """``$GPUFENCE_FAILPOINTS`` for the launcher's own points (see control/failpoints.py;
    only ``crash`` applies here: the launcher imports nothing of gpufence)."""
    for item in os.environ.get("GPUFENCE_FAILPOINTS", "").split(","):
        if item.strip().split("=")[0] == name:
            os.kill(os.getpid(), signal.SIGKILL)


def proc_stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of ``/proc/<pid>/stat`` (after the command name); None if the pid is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    end = data.rfind(b")")
    if end < 0:
        return None
    return data[end + 2 :].decode("ascii", "replace").split()


def proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (stat field 22); None if it is gone."""
    fields = proc_stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return int(fields[19])  # field 22 is the 20th after "pid (comm)"


def _usage(msg: str) -> int:
    print(f"gpufence launcher: {msg}", file=sys.stderr)
    print(
        "usage: launcher ATTEMPT_DIR --rank R [--catch SIGNUM]... -- ARGV...",
        file=sys.stderr,
    )
    return 2


class _SpawnError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _spawn(command: list[str], out_fd: int, err_fd: int, caught: set[signal.Signals]) -> int:
    """fork + exec the user command with clean signal state; raise ``_SpawnError`` on failure.

    Not ``posix_spawn``: glibc leaves its internal real-time signals ignored in the child, and an
    ignored disposition survives ``exec``. The launcher is single-threaded, so ``fork`` is safe.
    The caught signals stay blocked in the child until their dispositions are back to default.
    """
    r, w = os.pipe()  # close-on-exec: EOF tells the parent that exec succeeded
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child side, ends in exec or _exit
        try:
            os.close(r)
            os.dup2(out_fd, 1)
            os.dup2(err_fd, 2)
            # every disposition back to default: an ignored one (SIGHUP under nohup, SIGPIPE
            # from Python) would survive exec and change how the job reacts to signals
            for sig in signal.valid_signals():
                if sig not in (signal.SIGKILL, signal.SIGSTOP):
                    with contextlib.suppress(OSError, ValueError):
                        signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            os.execvp(command[0], command)
        except BaseException as exc:
            not_found = isinstance(exc, FileNotFoundError)
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
            os.write(w, f"{'n' if not_found else 'x'}{why}".encode(errors="replace"))
        finally:
            os._exit(EXIT_NOT_FOUND)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        report = fh.read()
    if not report:
        return pid
    os.waitpid(pid, 0)
    text = report.decode(errors="replace")
    if text[0] == "n":
        raise _SpawnError(EXIT_NOT_FOUND, f"command not found: {command[0]!r}: {text[1:]}")
    raise _SpawnError(EXIT_NOT_EXECUTABLE, f"cannot execute {command[0]!r}: {text[1:]}")


FENCE_GRACE_S = 5.0


def _wait_or_fence(child: int, parent: int) -> bool:
    """Return when ``child`` has exited (not reaped); True if that is because process ``parent``
    (the node agent) died first and the group was stopped: SIGTERM, up to ``FENCE_GRACE_S`` for
    the child to exit, then SIGKILL to it (the caller records the exit, then kills what is left
    of the group). Both ends are pidfds: no polling, and no confusion with a reused pid."""
    fd = os.pidfd_open(child)
    try:
        try:
            watch = os.pidfd_open(parent)
        except ProcessLookupError:
            watch = None  # already gone: fence at once
        try:
            if watch is not None:
                ready = select.select([fd, watch], [], [])[0]
                if fd in ready:
                    return False
            os.killpg(0, signal.SIGTERM)  # the group: the command and its children (we survive)
            if not select.select([fd], [], [], FENCE_GRACE_S)[0]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            return True
        finally:
            if watch is not None:
                os.close(watch)
    finally:
        os.close(fd)


def _noop(_signum: int, _frame: object) -> None:
    """Survive the signal; the user command in the same group receives it too."""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        return _usage("missing '--' before the command")
    split = args.index("--")
    opts, command = args[:split], args[split + 1 :]
    if not command:
        return _usage("empty command")
    if not opts:
        return _usage("missing ATTEMPT_DIR")
    attempt_dir = Path(opts.pop(0))
    rank: int | None = None
    caught = set(ALWAYS_CAUGHT)
    fence_parent: int | None = None
    while opts:
        opt = opts.pop(0)
        if not opts:
            return _usage(f"option {opt} needs a value")
        value = opts.pop(0)
        try:
            if opt == "--rank":
                rank = int(value)
            elif opt == "--catch":
                caught.add(signal.Signals(int(value)))
            elif opt == "--fence-parent":
                fence_parent = int(value) or None
            else:
                return _usage(f"unknown option {opt}")
        except ValueError:
            return _usage(f"bad value for {opt}: {value!r}")
    if rank is None:
        return _usage("missing --rank")
    fenced = False

    # Blocked first (the executor already starts us with them blocked; this covers a launcher run
    # by hand), then survivable: a pending one is forwarded once the user command exists.
    signal.pthread_sigmask(signal.SIG_BLOCK, caught)
    for sig in caught:
        signal.signal(sig, _noop)

    # descriptors the control plane leaked to us (not close-on-exec) must not reach the command
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))

    me = os.getpid()
    # the executor wrote this record already; on a full disk ours may fail, which is fine
    with contextlib.suppress(OSError):
        atomic_write(pid_file(attempt_dir, rank), pid_record(me, proc_start_time(me) or 0))

    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    out_fd = os.open(out_file(attempt_dir, rank), flags, 0o644)
    err_fd = os.open(err_file(attempt_dir, rank), flags, 0o644)
    code: int
    try:
        child = _spawn(command, out_fd, err_fd, caught)
    except _SpawnError as exc:
        code = exc.code
        with contextlib.suppress(OSError):  # a full disk must not cost the exit record
            os.write(err_fd, f"gpufence launcher: {exc.message}\n".encode())
    else:
        # when the command exists (exec done): the GPU's hand-off ends here, whatever the
        # command then spends on its own start-up
        started = {
            "pid": child,
            "exec_unix": time.time(),
            "devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "fence_parent": fence_parent,
        }
        with contextlib.suppress(OSError):  # informational (hand-off timing): may be lost
            atomic_write(attempt_dir / f"rank-{rank}.started", json.dumps(started) + "\n")
        # anything sent to the group before the command existed reached only us: pass it on
        early = signal.sigpending() & caught
        for sig in sorted(early):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, sig)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, caught)  # later ones: our no-op handlers
        if fence_parent is not None:
            fenced = _wait_or_fence(child, fence_parent)
        _, status = os.waitpid(child, 0)  # PEP 475: retried after a no-op handler runs
        code = os.waitstatus_to_exitcode(status)
    finally:
        os.close(out_fd)
        os.close(err_fd)
    write_exit_record(attempt_dir, rank, code, time.time())
    _failpoint("launcher.after-exit-record")
    if fenced:  # nobody is left to clean up after us: the rest of the group goes too (and we)
        os.killpg(0, signal.SIGKILL)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
