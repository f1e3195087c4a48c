"""The Unix users jobs run as: ``control.tenants.<name>.run_as`` and the default ``control.run_as``.

Each name is resolved at start-up (``pwd``/``grp``) to a ``RunAs(user, uid, gid, groups)``: uid
and primary gid from the passwd entry, supplementary groups from the group database. The server
refuses to start when a user does not exist, when a user has uid 0 and
``control.allow_run_as_root`` is not set, or when it is not root itself and so could not switch
to another user.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from gpufence.control.base.executor import RunAs


class RunAsError(ValueError):
    """A configured run_as user cannot be used; the message says why and what to do."""


def resolve_user(name: str, allow_root: bool) -> RunAs:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise RunAsError(
            f"no Unix user {name!r} on this machine; create it (useradd --system "
            f"--no-create-home {name}) or name an existing one"
        ) from None
    if entry.pw_uid == 0 and not allow_root:
        raise RunAsError(
            f"{name!r} is root (uid 0): a job running as root can read every tenant's files and "
            "the server's tokens; name an unprivileged user, or set "
            "control.allow_run_as_root: true if you really mean it"
        )
    me = os.geteuid()
    if me != 0 and entry.pw_uid != me:
        raise RunAsError(
            f"switching jobs to user {name!r} needs root, but gpufence runs as uid {me}; "
            "start it as root or remove run_as"
        )
    groups = tuple(dict.fromkeys(os.getgrouplist(name, entry.pw_gid)))
    return RunAs(user=name, uid=entry.pw_uid, gid=entry.pw_gid, groups=groups)


def home_of(run_as: RunAs) -> str:
    """The user's home directory from the passwd database ("/" when it has no entry now)."""
    try:
        return pwd.getpwuid(run_as.uid).pw_dir or "/"
    except KeyError:
        return "/"


def blocking_dir(path: Path, user: RunAs) -> Path | None:
    """The first directory on the way to ``path`` (ancestors only) that ``user`` may not pass
    through (no search permission by its mode; ACLs are not read), or None."""
    groups = {user.gid, *user.groups}
    for d in reversed(path.absolute().parents):
        try:
            st = d.stat()
        except OSError:
            return d
        if user.uid == 0:
            continue
        if st.st_uid == user.uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return d
    return None


def can_enter(path: str, who: RunAs | None) -> bool:
    """Whether ``who`` (None: the server's own user) could make ``path`` its working
    directory: a directory, and every directory from ``/`` down to it lets ``who`` pass
    (``blocking_dir``). A ``cwd`` is checked this way at submit, so the answer says only what
    the job's own user could find out by trying -- not, through the server's root, whether
    another tenant's private directory exists."""
    if not os.path.isdir(path):  # (no Path for the usual case: the submit hot path)
        return False
    # the directory itself must be passable too: it is the parent of anything in it
    return who is None or blocking_dir(Path(path) / "cwd", who) is None
