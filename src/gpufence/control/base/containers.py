"""Jobs in a container image (``submit --container IMAGE``): which images are accepted, and the
sandbox a member's command runs in.

**Runtime: bubblewrap** (``bwrap``, Debian's ``bubblewrap``). Apptainer/Singularity are not
packaged in Debian bookworm; ``runc`` and ``crun`` want an OCI bundle and manage cgroups
themselves (a second owner of the member's cgroup, which containment already creates, limits
and kills). ``bwrap`` has no daemon and no cgroup of its own: it is a bind-mount sandbox, run
*after* the launcher's child has joined the member's cgroup and switched to the job's user, so
the job's processes stay in that cgroup under its device rules, and it runs unprivileged (as the
job's user it takes a user namespace that maps that uid to itself: files are checked as that
user) as well as as root (with every capability dropped).

**Images.** A directory holding an unpacked root file system (``/bin/sh`` inside), or an
Apptainer/Singularity ``.sif`` file: its header is checked at submit (``sif``) and its squashfs
root partition is unpacked at launch, as the job's user, into the server's image cache
(``sifcache``); the tree is then run exactly like a directory image.

**What the job sees** (``sandbox_argv``): the image read-only, its directories at the paths they
have in the image; a fresh ``/proc``, a minimal ``/dev`` plus the member's own GPU device nodes
and the GPU driver's shared control nodes; ``/sys`` read-only; a private ``/tmp``; and, read-write
at the paths they have outside, only its attempt directory, its checkpoint directory and its
working directory. Nothing else of the data directory (the store, the admin token, other jobs)
exists inside. Because those paths are the same inside as outside, the job's variables
(``GPUFENCE_CHECKPOINT_DIR``, notice and ack files) and its logs need no translation: where an
image directory lies on such a path, it is rebuilt as a tmpfs directory holding the image's
other entries (``_image_ops``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

from gpufence.control.base.executor import RunAs
from gpufence.control.base.runas import blocking_dir
from gpufence.control.base.sif import SifError, inspect_header
from gpufence.control.base.sifcache import missing_unpacker, unpacker

RUNTIME = "bwrap"
RUNTIME_PACKAGE = "bubblewrap"
SUPPORTED_FORMS = (
    "an Apptainer/Singularity .sif file or a directory holding an unpacked root file system "
    "(with /bin/sh inside)"
)
_OWN = ("/proc", "/dev", "/sys", "/tmp")
"""Provided by the sandbox, never taken from the image."""
DRIVER_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
"""The NVIDIA driver's shared control nodes (not one GPU's: the device rules allow them too)."""


class ContainerError(ValueError):
    """A job's container cannot be run; the message says why and what to do."""


def runtime() -> str | None:
    """The runtime's path, or None when it is not installed."""
    return shutil.which(RUNTIME)


def missing_runtime() -> str:
    return (
        f"--container needs the container runtime {RUNTIME!r} on the server's machine "
        f"(apt-get install {RUNTIME_PACKAGE}); it is not on the PATH"
    )


def container_problem(
    image: str, cwd: str | None, who: RunAs | None, data_dir: Path, local: bool
) -> tuple[str, str] | None:
    """(the submit field, what is wrong and how to fix it) for a job with ``--container``,
    checked at submit; None when it can run."""
    if not local:
        return "container", "--container runs with the local executor only (not on Ray nodes)"
    if runtime() is None:
        return "container", missing_runtime()
    if _within(image, data_dir):
        return "container", f"{image} lies in the server's data directory; give an image outside it"
    problem = image_problem(image, who)
    if problem is not None:
        return "container", problem
    problem = cwd_problem(cwd, data_dir)
    return ("cwd", problem) if problem is not None else None


def image_problem(image: str, who: RunAs | None) -> str | None:
    """What is wrong with ``image`` for a job run as ``who`` (None: the server's user), or None.

    Asked as that user: an image it could not read itself gives the same answer as a missing
    one, so a submit can neither run nor probe another tenant's files through the server."""
    user = f"the job's user ({who.user})" if who is not None else "the server's user"
    path = Path(image)
    if image.endswith(".sif"):
        return sif_problem(path, who)
    if not _readable_dir(path, who):
        return f"{image} is not a directory {user} can read; give {SUPPORTED_FORMS}"
    shell = path / "bin" / "sh"
    if not (os.path.lexists(shell) or os.path.lexists(path / "usr" / "bin" / "sh")):
        return (
            f"{image} does not look like a root file system (no /bin/sh inside); give "
            f"{SUPPORTED_FORMS}"
        )
    return None


def sif_problem(path: Path, who: RunAs | None) -> str | None:
    """What is wrong with the ``.sif`` at ``path``, or None: a regular file ``who`` can read
    (checked as ``_readable_dir`` does, before the server reads a byte of it) whose header
    leads to a squashfs root partition inside the file (``sif.root_partition``). Unpacked at
    launch, as the job's user (``sifcache``)."""
    user = f"the job's user ({who.user})" if who is not None else "the server's user"
    if not _readable(path, who, want_dir=False):
        return f"{path} is not a .sif file {user} can read; give {SUPPORTED_FORMS}"
    if unpacker() is None:
        return missing_unpacker()
    try:
        inspect_header(str(path))
    except SifError as exc:
        return (
            f"{path}: {exc}; give an Apptainer/Singularity .sif with a squashfs root file "
            "system (as 'apptainer build' makes) or a directory holding an unpacked root file "
            "system"
        )
    return None


def _within(path: str, data_dir: Path) -> bool:
    data = Path(os.path.abspath(data_dir))
    inside = Path(os.path.abspath(path))
    return inside == data or data in inside.parents


def cwd_problem(cwd: str | None, data_dir: Path) -> str | None:
    """A working directory is mounted into the container as it is: one that holds the data
    directory, or lies in it, would bring the store, the admin token or other jobs' files in."""
    if cwd is None:
        return None
    if _within(cwd, data_dir) or Path(os.path.abspath(data_dir)).is_relative_to(cwd):
        return (
            f"{cwd} is, holds or lies in the server's data directory, which a container job "
            "must not see; give --cwd a directory outside it"
        )
    return None


def _readable_dir(path: Path, who: RunAs | None) -> bool:
    return _readable(path, who, want_dir=True)


def _readable(path: Path, who: RunAs | None, want_dir: bool) -> bool:
    """``path`` is a directory (``want_dir``; else a regular file) ``who`` may read, by the
    modes of it and of every directory above it (ACLs are not read)."""
    if not (path.is_dir() if want_dir else path.is_file()):
        return False
    if who is None or who.uid == 0:
        return True
    # every directory down to it (a directory: itself included)
    if blocking_dir(path / "x" if want_dir else path, who) is not None:
        return False
    st = path.stat()
    if st.st_uid == who.uid:
        bit = 0o400
    elif st.st_gid in {who.gid, *who.groups}:
        bit = 0o040
    else:
        bit = 0o004
    return bool(st.st_mode & bit)


def sandbox_argv(
    image: Path,
    binds: Iterable[Path],
    device_nodes: Sequence[str],
    cwd: Path,
    bwrap: str = RUNTIME,
) -> list[str]:
    """``bwrap`` and its options, to put before the member's command (see the module docstring).
    ``binds``: the directories the job writes, mounted read-write at the same paths."""
    wanted = sorted({Path(os.path.abspath(b)) for b in binds})
    ops = [bwrap, *_image_ops(image, Path("/"), wanted)]
    ops += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    ops += ["--ro-bind-try", "/sys", "/sys"]
    for node in (*device_nodes, *DRIVER_NODES):
        ops += ["--dev-bind-try", node, node]
    for b in wanted:
        ops += ["--bind", str(b), str(b)]
    # as root no user namespace is taken: drop what root could do with the sandbox's mounts
    ops += ["--cap-drop", "ALL", "--chdir", str(cwd), "--"]
    return ops


def _image_ops(src: Path, at: Path, wanted: list[Path]) -> list[str]:
    """The image's entries of directory ``src``, mounted at ``at`` inside: read-only binds (and
    symlinks) of each, except a directory that holds a path in ``wanted``, which becomes a
    tmpfs directory with the same treatment one level down."""
    ops: list[str] = []
    try:
        entries = sorted(os.scandir(src), key=lambda e: e.name)
    except OSError as exc:
        raise ContainerError(f"cannot read the image directory {src}: {exc.strerror}") from exc
    for entry in entries:
        inside = at / entry.name
        if str(inside) in _OWN:
            continue
        under = [w for w in wanted if w == inside or inside in w.parents]
        if entry.is_symlink():
            if under:
                raise ContainerError(
                    f"the image's {inside} is a symbolic link, but the job's directory "
                    f"{under[0]} must appear under it; put the data directory elsewhere"
                )
            ops += ["--symlink", os.readlink(entry.path), str(inside)]
        elif not under:
            ops += ["--ro-bind", entry.path, str(inside)]
        elif inside in under:
            continue  # a job directory itself: its bind is mounted there
        elif entry.is_dir(follow_symlinks=False):
            ops += ["--dir", str(inside)]
            ops += _image_ops(Path(entry.path), inside, under)
        else:
            raise ContainerError(
                f"the image's {inside} is a file, but the job's directory {under[0]} must "
                "appear under it; put the data directory elsewhere"
            )
    return ops
