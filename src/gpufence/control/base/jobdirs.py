"""A job's directories on disk: created private to its Unix user, and read back safely.

Layout (``DATA`` is the data dir; ``U`` the job's ``run_as`` user, else the server's own)::

    DATA/                         server  0700, or 0711 when jobs run as other users (they must
    DATA/jobs/                    server  pass through to reach their own directories)
    DATA/jobs/<job>/              server  same mode: a job cannot rename, replace or add anything
    DATA/jobs/<job>/attempt-N/        U   0700  rank-R.out / rank-R.err (U, 0600), notice
                                                (U, 0600, written by the executor), ack (the job's)
    DATA/jobs/<job>/attempt-N.records/  server  0700  the launcher's rank-R.pid / .started / .exit
                                                (a pty job's terminal socket, pty.sock, too)
    DATA/jobs/<job>/checkpoints/      U   0700  shared by the job's attempts

``prepare_job_dirs`` (called by an executor on the node where the member runs, before the first
member starts) creates them so. An existing directory must be a real directory (not a symlink)
owned by the user it belongs to, or the launch is refused: a directory a job could swap for a
link must never be written by the root server.

The launcher's records say which process group a restarted control plane signals and kills,
and how the job ended, so they live in a directory of the server's (``member_records.records_dir``):
the job cannot forge them. (Attempts started before that have them in ``attempt-N`` itself:
``processes.py`` trusts those only where no other user could have written them.)

``attempt-N`` belongs to the job, so the job can put symlinks or hard links in it. Whoever
writes there as the server must not follow them: a fresh attempt directory gets its log files
while it is still the server's (created, then handed over with ``fchown``), an old one has them
unlinked and created anew (``O_EXCL | O_NOFOLLOW``, relative to the directory's descriptor); the
launcher opens them with ``member_records.open_log`` (no link followed, a regular
singly-linked file only), and files the server writes later (the notice) are created under a
random name with ``O_EXCL | O_NOFOLLOW`` and renamed into place (``member_records.atomic_write``).
Readers as the server use ``open_job_file`` (the API's log reads): every component opened
with ``O_NOFOLLOW`` relative to the server-owned ``DATA/jobs``, and only a regular file with a
single link accepted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from gpufence.control.base.executor import Launch, LaunchError, RunAs
from gpufence.control.base.member_records import (
    err_file,
    exit_file,
    out_file,
    pid_file,
    records_dir,
    started_file,
)
from gpufence.control.base.privatefs import PRIVATE_DIR, PRIVATE_FILE, dir_mode, ensure_dir

log = logging.getLogger("gpufence.jobdirs")

JOBS_DIR = "jobs"
NOTICE_FILE = "notice"
ACK_FILE = "ack"
_PASS = 0o011  # group/other search bits: what another user needs to pass through
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def owner_of(run_as: RunAs | None) -> tuple[int, int] | None:
    """(uid, gid) files of the job must be given; None: the server's own (nothing to change)."""
    if run_as is None or run_as.uid == os.geteuid():
        return None
    return run_as.uid, run_as.gid


def _widen(path: Path) -> None:
    """Let other users pass through ``path`` (never narrows: other jobs may rely on it)."""
    st = os.stat(path)
    if st.st_mode & _PASS != _PASS:
        mode = stat.S_IMODE(st.st_mode) | _PASS
        log.warning("%s: mode set to %04o so jobs of other users can reach their dirs", path, mode)
        os.chmod(path, mode)


def _server_dir(path: Path, traverse: bool) -> bool:
    """A directory of the server's (created 0700, or 0711 with ``traverse``; a traversable one
    stays so); True if it was made now."""
    made = True
    try:
        os.mkdir(path, PRIVATE_DIR)
    except FileExistsError:
        made = False
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise LaunchError(
                f"{path} is not a directory of gpufence's own (uid {os.geteuid()}); move it away"
            ) from None
    if traverse:
        _widen(path)
    return made


def _new_file(dir_fd: int, name: str, owner: tuple[int, int] | None, replace: bool) -> None:
    """An empty ``name`` (0600, owned by ``owner``) in the directory ``dir_fd``; with ``replace``
    whatever has that name goes first (unlinked, never followed or truncated: it may be a link
    the job planted). A name taken again in between fails the create (``O_EXCL``)."""
    if replace:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
    fd = os.open(name, _NEW_FILE, PRIVATE_FILE, dir_fd=dir_fd)
    try:
        if owner is not None:
            os.fchown(fd, *owner)
    finally:
        os.close(fd)


def _user_dir(path: Path, run_as: RunAs | None, logs: Iterable[str] = ()) -> bool:
    """A directory of the job's user, mode 0700, never through a symlink; True if it was made
    now, with empty ``logs`` in it (it is the server's until they are made)."""
    uid = run_as.uid if run_as is not None else os.geteuid()
    owner = owner_of(run_as)
    try:
        os.mkdir(path, PRIVATE_DIR)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            what = "a symlink" if stat.S_ISLNK(st.st_mode) else f"owned by uid {st.st_uid}"
            who = run_as.user if run_as is not None else "the server's user"
            raise LaunchError(
                f"{path} is {what}, but the job runs as {who} (uid {uid}); move it away, or "
                f"chown -R {uid} it if it holds this job's data"
            ) from None
        if stat.S_IMODE(st.st_mode) != PRIVATE_DIR:
            log.warning("%s had mode %04o; set to 0700", path, stat.S_IMODE(st.st_mode))
            os.chmod(path, PRIVATE_DIR, follow_symlinks=False)
        return False  # its logs are reset_attempt's, once no member of it is found running
    names = list(logs)
    if not names and owner is None:
        return True
    fd = os.open(path, _DIR_FLAGS)
    try:
        for name in names:
            _new_file(fd, name, owner, replace=False)
        if owner is not None:  # handed over only now: nothing of the job's can be in it
            os.fchown(fd, *owner)
    finally:
        os.close(fd)
    return True


def prepare_job_dirs(
    attempt_dir: Path, checkpoint_dir: Path, run_as: RunAs | None, ranks: Iterable[int] = ()
) -> bool:
    """Create the job's directories (see the module docstring), with fresh empty logs of
    ``ranks`` in a new attempt directory. True if the attempt directory and its records
    directory are new (nothing of an earlier start to check or clear; else see
    ``reset_attempt``). ``LaunchError`` if one exists
    but is not what it must be, or cannot be created."""
    traverse = run_as is not None and run_as.uid != os.geteuid()
    job = attempt_dir.parent
    try:
        for d in (job.parent.parent, job.parent):  # DATA, DATA/jobs (the server made them)
            if not d.exists():  # a Ray node that never ran a job of this data dir
                ensure_dir(d, dir_mode(traverse))
            elif traverse:
                _widen(d)
        _server_dir(job, traverse)
        records = _server_dir(records_dir(attempt_dir), traverse=False)
        logs = [f(attempt_dir, r).name for r in ranks for f in (out_file, err_file)]
        fresh = _user_dir(attempt_dir, run_as, logs)
        _user_dir(checkpoint_dir, run_as)
    except OSError as exc:
        raise LaunchError(f"cannot create the job's directories under {job}: {exc}") from exc
    return fresh and records


def reset_attempt(attempt_dir: Path, run_as: RunAs | None, ranks: Iterable[int]) -> None:
    """Clear what an earlier start left in an attempt directory that exists already (check
    first that none of its members still runs): the records of ``ranks``, the notice and the ack,
    and new empty logs (the old names unlinked, never followed). ``LaunchError`` on failure."""
    owner = owner_of(run_as)
    rank_list = list(ranks)
    try:
        for rec in (
            f(attempt_dir, r) for r in rank_list for f in (pid_file, exit_file, started_file)
        ):
            rec.unlink(missing_ok=True)  # in the server's own records directory
        fd = os.open(attempt_dir, _DIR_FLAGS)
        try:
            for name in (NOTICE_FILE, ACK_FILE):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=fd)
            for name in (f(attempt_dir, r).name for r in rank_list for f in (out_file, err_file)):
                _new_file(fd, name, owner, replace=True)
        finally:
            os.close(fd)
    except OSError as exc:
        raise LaunchError(f"cannot prepare {attempt_dir}: {exc}") from exc


def prepare_launch_dirs(launch: Launch) -> bool:
    """``prepare_job_dirs`` for every member of ``launch`` (all on this machine)."""
    return prepare_job_dirs(
        launch.attempt_dir.absolute(),
        launch.checkpoint_dir.absolute(),
        launch.run_as,
        range(len(launch.members)),
    )


def working_dir(launch: Launch) -> Path:
    """Where the job starts: its ``cwd``, else its own attempt directory (always there, always
    its user's; the server's working directory may be one the job's user cannot enter). Entered
    as the job's user (``launcher.Confine``), so a ``cwd`` that user may not reach fails the start
    rather than being entered with the server's rights."""
    return launch.cwd if launch.cwd is not None else launch.attempt_dir.absolute()


def open_job_file(data_dir: Path, job_id: str, attempt: int, name: str) -> BinaryIO | None:
    """``DATA/jobs/<job>/attempt-N/<name>`` opened for reading without following any link the
    job may have planted; None if it does not exist or is not a plain, singly linked file."""
    if "/" in job_id or job_id in (".", "..") or "/" in name or name in (".", ".."):
        return None
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fds: list[int] = []
    try:  # DATA/jobs is the server's own (it may be a link the admin made); below it, no links
        fds.append(os.open(data_dir / JOBS_DIR, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY))
        fds.append(os.open(job_id, flags | os.O_DIRECTORY, dir_fd=fds[-1]))
        fds.append(os.open(f"attempt-{attempt}", flags | os.O_DIRECTORY, dir_fd=fds[-1]))
        fd = os.open(name, flags | os.O_NONBLOCK, dir_fd=fds[-1])
    except OSError:  # missing, or a link where a directory or the file should be
        return None
    finally:
        for d in fds:
            os.close(d)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")
