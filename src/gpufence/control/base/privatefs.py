"""Files and directories the control plane keeps private: created with their final mode.

Every path the server creates gets its mode at creation (``mkdir(mode)``, ``open(O_CREAT, mode)``),
never a ``chmod`` afterwards, so there is no moment at which a store, a token or a log is readable
by others. ``gpufence up`` also sets the process umask to ``PRIVATE_UMASK`` before it creates
anything, which covers what libraries create without a mode of ours (SQLite's ``-wal``/``-shm``
take the database file's mode anyway) and what jobs inherit.

Modes (see the README's *Tenant isolation* section):

* the data dir and ``DATA/jobs``: ``0700``, or ``0711`` (search-only for others: no listing, no
  reading) when jobs run as other Unix users, who must traverse them to reach their own job
  directories;
* every file the server writes: ``0600``.

A directory that already exists with another mode (a data dir from an older gpufence, or one that
now needs traversal) is set to the mode it needs, and the change is logged; one that is not the
server's own or is a shared sticky directory (``--data /tmp``) is refused instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("gpufence.files")

PRIVATE_UMASK = 0o077
PRIVATE_DIR = 0o700
TRAVERSE_DIR = 0o711
"""Other users may pass through (to their own job directory) but not list or read."""
PRIVATE_FILE = 0o600


class PrivateDirError(ValueError):
    """A directory gpufence should keep private is not its own to set (the message says why)."""


def dir_mode(traversable: bool) -> int:
    return TRAVERSE_DIR if traversable else PRIVATE_DIR


def set_private_umask() -> int:
    """Process-wide: for ``gpufence up`` (a process entry point), never for a library call; the
    previous umask is returned."""
    return os.umask(PRIVATE_UMASK)


def ensure_dir(path: Path, mode: int) -> None:
    """``path`` exists as a directory with exactly ``mode`` (missing parents: ``mode`` too)."""
    missing: list[Path] = []
    p = path
    while not p.exists() and p.parent != p:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, mode & PRIVATE_DIR)  # owner bits only: the umask can only narrow them
        except FileExistsError:
            missing.remove(d)  # created meanwhile by someone else: checked below like any other
            continue
        if stat.S_IMODE(os.stat(d).st_mode) != mode:
            os.chmod(d, mode)  # widen 0700 -> 0711: at no moment readable by others
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path} is not a directory")
    have = stat.S_IMODE(st.st_mode)
    if have != mode and (st.st_uid != os.geteuid() or have & stat.S_ISVTX):
        raise PrivateDirError(
            f"{path} is a shared directory (mode {have:04o}, owner uid {st.st_uid}); give "
            f"gpufence a directory of its own, e.g. {path / 'gpufence'}"
        )
    if have != mode:
        log.warning("%s had mode %04o; set to %04o", path, have, mode)
        os.chmod(path, mode)


def write_private(path: Path, text: str) -> None:
    """Write ``path`` (mode 0600 from its creation) so that readers see the old file or the new
    one whole: a temporary file in the same directory, fsynced, then renamed over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def create_private(path: Path, text: str) -> bool:
    """Create ``path`` (0600) holding ``text`` unless it exists; True if this call created it.

    Written to a temporary file first and *linked* into place, so a concurrent reader (or a
    second server racing for the same data dir) never sees a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def touch_private(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist (e.g. before SQLite opens it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, PRIVATE_FILE)
    os.close(fd)


def tighten_existing(data_dir: Path, jobs_dir: Path) -> int:
    """Files directly in ``data_dir`` readable by others become 0600, and job directories with
    group/other read or write bits 0700: a data dir of an older gpufence (umask 022) must not
    expose its store or logs once the data dir lets other users pass (0711). Returns how many
    were changed (each is logged)."""
    changed = 0
    candidates: list[tuple[Path, int]] = []
    with contextlib.suppress(FileNotFoundError):
        candidates += [(p, PRIVATE_FILE) for p in data_dir.iterdir()]
    with contextlib.suppress(FileNotFoundError):
        candidates += [(p, PRIVATE_DIR) for p in jobs_dir.iterdir()]
    for p, mode in candidates:
        st = p.lstat()
        want_dir = mode == PRIVATE_DIR
        if stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode) != want_dir:
            continue
        if st.st_uid == os.geteuid() and st.st_mode & 0o066:
            log.warning("%s had mode %04o; set to %04o", p, stat.S_IMODE(st.st_mode), mode)
            os.chmod(p, mode, follow_symlinks=False)
            changed += 1
    return changed
