"""A ``.sif`` image's root file system, unpacked once per user into the server's image cache.

``unpacked_root`` is what the local executor calls before it starts a job whose image is a
``.sif``; the directory it returns is then run exactly like a directory image
(``containers.sandbox_argv``).

**As the job's user.** The image is opened by a process of the user the job runs as
(``open_as``; a server not running as root opens it as itself): the kernel decides whether that
user may read it, so the server never reads a file for a tenant that the tenant could not.
Through that one descriptor the server reads the header and hashes the file (``sif``) and
``unsquashfs`` (Debian's ``squashfs-tools``), run as that user, extracts the primary partition
at its offset -- so the tree is made with that user's rights: no device nodes, no files owned
by others, no set-user-id root binaries (xattrs, file capabilities included, are not
extracted at all). A job that runs as the server's own user unpacks as that user: as root, an
image's device nodes and set-user-id files are made, in ``u0`` (0700, root's: no other user
reaches them), and inside the sandbox every image mount is ``nosuid,nodev`` (bubblewrap's
binds), as for a directory image.

**Where.** ``DATA/images/`` (the server's, 0711) holds one directory per user, ``u<uid>``
(that user's, 0700: no one else can list or read it), which holds one tree per image, named
by the sha256 of the whole ``.sif`` file. A second job of the same user and the same image
content reuses the tree; the same content under another user is unpacked again, into that
user's own directory, so nothing one tenant unpacked is ever shown to another. A user can
change its own trees (they are its files), which changes only its own jobs' images, as
editing its own directory image would.

**Bounded.** At most ``KEEP`` trees per user: after an unpack the least recently used trees
beyond that are deleted, except those a running job of this server uses (``in_use``).
Trees are not otherwise limited in size: a ``.sif`` that unpacks to more than the data
directory's free space fails the job with unsquashfs's error.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import time
from collections.abc import Collection
from pathlib import Path
from typing import BinaryIO

from gpufence.control.base import sif
from gpufence.control.base.executor import RunAs

IMAGES_DIR = "images"
"""The image cache, in the data directory."""
UNSQUASHFS = "unsquashfs"
UNSQUASHFS_PACKAGE = "squashfs-tools"
KEEP = 4
"""Unpacked images kept per user (the least recently used beyond it are deleted)."""
UNPACK_TIMEOUT_S = 600.0
OPEN_TIMEOUT_S = 30.0
_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


class ImageError(ValueError):
    """The ``.sif`` could not be prepared; the message says why."""


def unpacker() -> str | None:
    return shutil.which(UNSQUASHFS)


def missing_unpacker() -> str:
    return (
        f"a .sif image needs {UNSQUASHFS!r} on the server's machine (apt-get install "
        f"{UNSQUASHFS_PACKAGE}); it is not on the PATH"
    )


def _switch(who: RunAs | None) -> bool:
    return who is not None and who.uid != os.geteuid()


def _call(
    argv: list[str], who: RunAs | None, pass_fds: tuple[int, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``argv`` run as ``who`` (None, or the server's own uid: as the server itself)."""
    switch = who is not None and _switch(who)
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=_ENV,
        cwd="/",
        timeout=UNPACK_TIMEOUT_S,
        check=False,
        pass_fds=pass_fds,
        # not the server's 077: the image's modes as they are (the user's directory is 0700)
        umask=0o022,
        user=who.uid if switch and who is not None else None,
        group=who.gid if switch and who is not None else None,
        extra_groups=list(who.groups) if switch and who is not None else None,
    )


def _run(argv: list[str], who: RunAs | None, what: str, pass_fds: tuple[int, ...] = ()) -> str:
    try:
        done = _call(argv, who, pass_fds)
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"{what} took over {UNPACK_TIMEOUT_S:.0f} s") from exc
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise ImageError(f"{what}: {tail}")
    return done.stdout


def user_cache(cache: Path, who: RunAs | None) -> Path:
    """``cache/u<uid>``, made (0700, the user's) when missing; ``cache`` itself 0711."""
    uid = who.uid if who is not None else os.geteuid()
    try:
        cache.mkdir()
        cache.chmod(0o711)  # explicitly: the server's umask is 077
    except FileExistsError:
        pass
    mine = cache / f"u{uid}"
    try:
        mine.mkdir(mode=0o700)
    except FileExistsError:
        return mine
    if who is not None and _switch(who):
        os.chown(mine, who.uid, who.gid)
    return mine


def open_as(image: Path, who: RunAs | None) -> BinaryIO:
    """``image`` opened for reading by ``who``: a shell run as that user opens it (the kernel
    checks that user's rights, ACLs included) and waits; the server then opens the same file
    through that shell's descriptor (``/proc/PID/fd/3``). Never the server's own open of the
    path, which as root would read anything."""
    if not _switch(who):
        return _open(str(image))
    assert who is not None
    holder = subprocess.Popen(
        ["sh", "-c", 'exec 3<"$1" && echo opened && read _', "sh", str(image)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_ENV,
        cwd="/",
        user=who.uid,
        group=who.gid,
        extra_groups=list(who.groups),
    )
    assert holder.stdin is not None and holder.stdout is not None and holder.stderr is not None
    try:
        ready = select.select([holder.stdout], [], [], OPEN_TIMEOUT_S)[0]
        if not ready or holder.stdout.readline() != b"opened\n":
            holder.kill()
            said = holder.stderr.read().decode(errors="replace").strip().splitlines()
            why = said[-1].split(": ")[-1] if said else "it did not open in time (a FIFO?)"
            raise ImageError(f"{image}: the job's user ({who.user}) cannot read it: {why}")
        return _open(f"/proc/{holder.pid}/fd/3")
    finally:
        holder.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            holder.kill()
        holder.wait()


def _open(path: str) -> BinaryIO:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ImageError(f"{path}: cannot be read: {exc.strerror}") from exc
    return os.fdopen(fd, "rb")


def unpacked_root(
    image: Path, who: RunAs | None, cache: Path, in_use: Collection[Path] = ()
) -> Path:
    """The directory holding ``image``'s root file system for jobs run as ``who``: the cached
    tree of its content, unpacked now if there is none (see the module docstring)."""
    with open_as(image, who) as f:
        try:
            part, digest = sif.inspect_file(f)
        except sif.SifError as exc:
            raise ImageError(f"{image}: {exc}") from exc
        mine = user_cache(cache, who)
        tree = mine / digest
        if not tree.is_dir():
            _unpack(f.fileno(), part.offset, tree, who)
    os.utime(tree)  # its last use, for eviction
    evict(mine, who, keep=KEEP, in_use={*in_use, tree})
    return tree


def _unpack(fd: int, offset: int, tree: Path, who: RunAs | None) -> None:
    """Extract the image open as ``fd`` (the very file hashed: handed to unsquashfs, which
    reads it as ``/proc/self/fd/N``) into a fresh directory beside ``tree`` and rename it into
    place, so a tree that exists is whole (a second unpack of the same image loses the race)."""
    tool = unpacker()
    if tool is None:
        raise ImageError(missing_unpacker())
    work = tree.with_name(f".unpack-{tree.name[:16]}-{os.getpid()}-{time.monotonic_ns()}")
    # -no-exit-code: what a user may not make (device nodes, other owners) is skipped, not a
    # failure; a corrupt image or a full disk still is (fatal errors keep their exit code)
    argv = [tool, "-no-exit-code", "-no-xattrs", "-no-progress", "-quiet", "-processors", "1"]
    argv += ["-offset", str(offset), "-dest", str(work), f"/proc/self/fd/{fd}"]
    try:
        _run(argv, who, "unpacking the image", pass_fds=(fd,))
        _run(["chmod", "0755", str(work)], who, f"opening {work}")
        try:
            work.rename(tree)
        except OSError:
            if not tree.is_dir():
                raise
    finally:
        if work.exists():
            _remove(work, who)


def _remove(tree: Path, who: RunAs | None) -> None:
    """As the user that made it: a tree may hold directories without write permission for it
    (unsquashfs keeps the image's modes), which rm -rf as that user still handles by
    chmod-ing first."""
    _call(["chmod", "-R", "u+rwx", str(tree)], who)
    _call(["rm", "-rf", "--", str(tree)], who)


def evict(mine: Path, who: RunAs | None, keep: int, in_use: Collection[Path]) -> list[Path]:
    """Delete the least recently used trees of ``mine`` beyond ``keep`` (never one in
    ``in_use``); the deleted ones."""
    trees = sorted(
        (p for p in mine.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    gone = [t for t in trees[keep:] if t not in in_use]
    for t in gone:
        _remove(t, who)
    return gone
