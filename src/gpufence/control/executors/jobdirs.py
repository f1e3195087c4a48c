"""A job's directories on disk: created private to its Unix user, and read back safely.

Layout (``DATA`` is the data dir; ``U`` the job's ``run_as`` user, else the server's own)::

    DATA/                    server   0700, or 0711 when jobs run as other users (they must
    DATA/jobs/               server   pass through to reach their own directories)
    DATA/jobs/<job>/         server   same mode: a job cannot rename or replace what is in it
    DATA/jobs/<job>/attempt-N/   U    0700  pid/exit records, stdout/stderr, notice and ack
    DATA/jobs/<job>/checkpoints/ U    0700  shared by the job's attempts

``prepare_job_dirs`` (called by an executor on the node where the member runs, before the first
member starts) creates them so; an existing one must be a real directory (not a symlink) owned by
``U``, or the launch is refused: a directory a job could swap for a link must never be written
by the root server.

Because ``attempt-N`` belongs to the job, the job can put symlinks or hard links in it. Whoever
reads or writes there as the server must not follow them: ``open_job_file`` (the API's log
reads) opens every component with ``O_NOFOLLOW`` relative to the server-owned ``DATA/jobs`` and
accepts only a regular file with a single link; writers must create files with
``O_EXCL``/``O_NOFOLLOW`` or by rename (``launcher.atomic_write``).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import BinaryIO

from gpufence.control.executors.interface import Launch, LaunchError, RunAs
from gpufence.control.privatefs import PRIVATE_DIR, dir_mode, ensure_dir

log = logging.getLogger("gpufence.jobdirs")

JOBS_DIR = "jobs"
_PASS = 0o011  # group/other search bits: what another user needs to pass through


def _widen(path: Path) -> None:
    """Let other users pass through ``path`` (never narrows: other jobs may rely on it)."""
    st = os.stat(path)
    if st.st_mode & _PASS != _PASS:
        mode = stat.S_IMODE(st.st_mode) | _PASS
        log.warning("%s: mode set to %04o so jobs of other users can reach their dirs", path, mode)
        os.chmod(path, mode)


def _server_dir(path: Path, traverse: bool) -> None:
    """A directory of the server's (created 0700 or 0711; a traversable one stays so)."""
    try:
        os.mkdir(path, PRIVATE_DIR)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise LaunchError(
                f"{path} is not a directory of gpufence's own (uid {os.geteuid()}); move it away"
            ) from None
    if traverse:
        _widen(path)


def _user_dir(path: Path, run_as: RunAs | None) -> None:
    """A directory of the job's user, mode 0700, never through a symlink."""
    uid = run_as.uid if run_as is not None else os.geteuid()
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
        return
    if run_as is not None and uid != os.geteuid():
        os.chown(path, run_as.uid, run_as.gid, follow_symlinks=False)


def prepare_job_dirs(attempt_dir: Path, checkpoint_dir: Path, run_as: RunAs | None) -> None:
    """Create the job's directories (see the module docstring); ``LaunchError`` if one exists
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
        _user_dir(attempt_dir, run_as)
        _user_dir(checkpoint_dir, run_as)
    except OSError as exc:
        raise LaunchError(f"cannot create the job's directories under {job}: {exc}") from exc


def prepare_launch_dirs(launch: Launch) -> None:
    prepare_job_dirs(launch.attempt_dir.absolute(), launch.checkpoint_dir.absolute(), launch.run_as)


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
