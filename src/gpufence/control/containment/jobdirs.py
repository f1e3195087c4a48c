"""A job's directories on disk, made for the user it runs as.

The attempt directory (launcher records, logs, notice and ack files) and the checkpoint
directory belong to the job's user, mode 0700: another tenant's job cannot read them. The
directories above them (``DATA``, ``DATA/jobs``, ``DATA/jobs/JOB``) need only be traversable by
that user (execute bit, no read bit: nobody can list the jobs); the launcher's own records are
written by the launcher, which keeps the control plane's identity.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from gpufence.control.executors.interface import RunAs

TRAVERSE = stat.S_IXGRP | stat.S_IXOTH
LISTING = stat.S_IRGRP | stat.S_IWGRP | stat.S_IROTH | stat.S_IWOTH


def make_job_dirs(dirs: Iterable[Path], run_as: RunAs | None, up_to: Path | None) -> set[Path]:
    """Create ``dirs`` (0700, owned by ``run_as`` when given); with ``run_as``, give every
    directory from their parents up to ``up_to`` (included) the traverse bits. The ones made
    now (the others were there already); OSError on failure."""
    made: set[Path] = set()
    for d in dirs:
        try:
            d.mkdir(mode=0o700)
            made.add(d)
        except FileNotFoundError:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            made.add(d)
        except FileExistsError:
            pass
        if run_as is not None:
            os.chown(d, run_as.uid, run_as.gid)
            _traversable(d.parent, up_to)
        os.chmod(d, 0o700)
    return made


def own_file(path: Path, run_as: RunAs | None) -> None:
    """An empty (truncated) file the job writes (its logs): 0600, owned by its user."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        if run_as is not None:
            os.fchown(fd, run_as.uid, run_as.gid)
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def _traversable(d: Path, up_to: Path | None) -> None:
    """The traverse bits on ``d`` and its ancestors up to ``up_to``, and no read bits for others
    below ``up_to`` (nobody lists the jobs); only ``d`` when ``up_to`` is not one of them:
    nothing outside the data directory is changed."""
    d, top = d.absolute(), up_to.absolute() if up_to is not None else None
    chain = [d]
    if top is not None and top in d.parents:
        while chain[-1] != top:
            chain.append(chain[-1].parent)
    for x in chain:
        mode = stat.S_IMODE(os.stat(x).st_mode)
        want = mode | TRAVERSE if x == top else (mode | TRAVERSE) & ~LISTING
        if want != mode:
            os.chmod(x, want)
