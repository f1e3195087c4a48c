"""The records a gang member leaves, and where: pid, start and exit records in the control
plane's ``attempt-N.records`` directory, the job's logs, and the exit spool that survives a full
data disk (see ``launcher.py``, which writes them, and the executors and recovery, which read
them).

Standard library only: the launcher imports this module when the Ray node agent runs it by path
with ``python -I -S`` (no ``site``, nothing of gpufence's dependencies).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat as _stat
import time
from pathlib import Path

RECORDS_SUFFIX = ".records"


def records_dir(attempt_dir: Path) -> Path:
    """``attempt-N.records``, beside the attempt directory: the launcher's records, in a
    directory of the control plane's that the job (which owns ``attempt-N``) cannot write."""
    return attempt_dir.with_name(attempt_dir.name + RECORDS_SUFFIX)


def pty_socket(attempt_dir: Path) -> Path:
    """A pty job's terminal socket (``ptyhost.py``), in the records directory: the job's own
    directory would let it plant a link there, or connect to its own terminal's host."""
    return records_dir(attempt_dir) / "pty.sock"


def pid_file(attempt_dir: Path, rank: int) -> Path:
    return records_dir(attempt_dir) / f"rank-{rank}.pid"


def exit_file(attempt_dir: Path, rank: int) -> Path:
    return records_dir(attempt_dir) / f"rank-{rank}.exit"


def started_file(attempt_dir: Path, rank: int) -> Path:
    return records_dir(attempt_dir) / f"rank-{rank}.started"


def logcap_file(attempt_dir: Path, rank: int) -> Path:
    """The launcher's note that it cut the member's logs to their limit (``logcap.py``)."""
    return records_dir(attempt_dir) / f"rank-{rank}.logcap"


def out_file(attempt_dir: Path, rank: int) -> Path:
    return attempt_dir / f"rank-{rank}.out"


def err_file(attempt_dir: Path, rank: int) -> Path:
    return attempt_dir / f"rank-{rank}.err"


_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def atomic_write(
    path: Path, text: str, owner: tuple[int, int] | None = None, fsync: bool = False
) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one: a new
    file under a random name (``O_EXCL | O_NOFOLLOW``: never through a link planted in a job's
    directory), given to ``owner`` (uid, gid) if set, flushed to the disk with ``fsync``, then
    renamed over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
    try:
        fd = os.open(tmp, _NEW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            if owner is not None:
                os.fchown(fd, *owner)
            fh.write(text)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def open_log(path: Path | str) -> int:
    """``path`` (a log in the job's directory, which the job may have changed meanwhile) opened
    for appending as the control plane: never through a symlink (``O_NOFOLLOW``), created only if
    missing (``O_EXCL``), and only a regular file with one link (not a FIFO, not a hard link to
    a file elsewhere). OSError otherwise."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:  # ELOOP: a symlink; ENXIO: a FIFO nobody reads; EEXIST: a race
        raise OSError(
            exc.errno, f"{path} is not a plain file of its own ({exc.strerror})"
        ) from None
    st = os.fstat(fd)
    if not _stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise OSError(f"{path} is not a plain file of its own (a link or a special file)")
    os.set_blocking(fd, True)
    return fd


def read_text(path: Path) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def pid_record(pid: int, start_time: int) -> str:
    """Content of ``rank-R.pid`` (JSON, written by hand: one fixed shape)."""
    return f'{{"pid": {int(pid)}, "start_time": {int(start_time)}}}\n'


def exit_record(code: int, ended_unix: float, stop_reached: bool | None = None) -> str:
    """Content of ``rank-R.exit``. ``stop``: whether a stop signal (SIGTERM/SIGINT to the
    group) had reached the member before its command exited; absent where unknown (an older
    launcher, a record written for it at recovery)."""
    stop = "" if stop_reached is None else f', "stop": {"true" if stop_reached else "false"}'
    return f'{{"code": {int(code)}, "ended_unix": {float(ended_unix)!r}{stop}}}\n'


STOPS = frozenset({signal.SIGTERM, signal.SIGINT})
"""The signals that stop a member (the checkpoint notice, SIGUSR1 by default, does not)."""

EXIT_RESERVED = 256
"""Bytes reserved for ``rank-R.exit`` at spawn; the record is overwritten into them."""
SPOOL_ENV = "GPUFENCE_EXIT_SPOOL"
DEFAULT_SPOOL = "/dev/shm/gpufence-exits"


def reserved_exit_record() -> str:
    """The placeholder (``code`` null: "not exited yet") that reserves the record's blocks."""
    return '{"code": null}'.ljust(EXIT_RESERVED - 1) + "\n"


LAUNCHER_ENV = (SPOOL_ENV, "GPUFENCE_FAILPOINTS")
"""The control plane's variables the launcher itself reads (never passed on to the job)."""


def launcher_env() -> dict[str, str]:
    """Those of ``LAUNCHER_ENV`` this process has: what a launcher it starts must see too."""
    return {k: os.environ[k] for k in LAUNCHER_ENV if os.environ.get(k)}


def spool_file(attempt_dir: Path, rank: int) -> Path:
    """Where a record goes when the attempt directory takes no writes (outside the data disk)."""
    key = hashlib.sha256(str(attempt_dir.absolute()).encode()).hexdigest()[:32]
    return Path(os.environ.get(SPOOL_ENV) or DEFAULT_SPOOL) / f"{key}-rank-{rank}.exit"


def private_spool(create: bool = False) -> Path | None:
    """The spool directory if it is the control plane's own (made now with ``create``): a real
    directory of this uid that no one else may write. ``/dev/shm`` is writable by everyone, so a
    job could make the directory first and forge exit records in it: such a spool is neither
    written nor read (None)."""
    d = spool_file(Path("/"), 0).parent
    if create:
        with contextlib.suppress(OSError):
            d.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, 0o700)
    try:
        st = os.lstat(d)
    except OSError:
        return None
    if not _stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    return d


def _overwrite_reserved(path: Path, text: str) -> None:
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_size != EXIT_RESERVED or len(data) > EXIT_RESERVED:
            raise OSError(f"{path} is not a reserved exit record")
        os.pwrite(fd, data.ljust(EXIT_RESERVED - 1) + b"\n", 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_exit_record(
    attempt_dir: Path, rank: int, code: int, ended_unix: float, stop_reached: bool | None = None
) -> str:
    """Record how the member ended, whatever state the data disk is in; returns where.

    In order: into the reserved record in place, as a new file (atomic), to the spool; if none
    works, wait and try again (with backoff, up to 5 s apart) for as long as it takes."""
    text = exit_record(code, ended_unix, stop_reached)
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
            if private_spool(create=True) is not None:
                atomic_write(spool_file(attempt_dir, rank), text, fsync=True)
                return "spool"
        time.sleep(min(5.0, 0.05 * 2**tries))
        tries += 1


def write_lost_record(attempt_dir: Path, rank: int, why: str, ended_unix: float) -> None:
    """A member that ended without running its command in a way that says nothing of the job
    (``launcher.SpawnLost``): no code (readers take it as lost), and why. Best effort: with no
    record at all the member reads as lost too."""
    text = json.dumps({"code": None, "ended_unix": ended_unix, "lost": why}) + "\n"
    path = exit_file(attempt_dir, rank)
    with contextlib.suppress(OSError):
        _overwrite_reserved(path, text)
        return
    with contextlib.suppress(OSError):
        atomic_write(path, text, fsync=True)


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
