"""Managed Unix users: the user a tenant's jobs run as when its config names none.

A root server never runs a tenant's job as root by default: a job running as root reads the
store, every token and every other tenant's files, and can move itself out of its cgroup. So a
tenant without ``control.tenants.<name>.run_as`` gets a user of its own, ``gpufence-<tenant>``,
which the server creates at start-up when it is missing::

    useradd --system --user-group --no-create-home --home-dir /nonexistent \\
            --shell /usr/sbin/nologin gpufence-<tenant>

The user owns nothing but its jobs' directories; the cgroups its jobs run in stay root's (not
writable by it). Tenant names that are not valid Unix user names (upper case, dots, too long)
are mapped to ``gpufence-<cleaned>-<hash>`` so two tenants never share a user.
"""

from __future__ import annotations

import hashlib
import pwd
import re
import shutil
import subprocess

from gpufence.control.base.executor import RunAs
from gpufence.control.base.runas import RunAsError, resolve_user

PREFIX = "gpufence-"
_MAX_NAME = 32  # Linux user names (useradd, utmp)
_VALID = re.compile(r"^[a-z_][a-z0-9_-]*$")


def managed_name(tenant: str) -> str:
    """``gpufence-<tenant>``; a tenant name that is no valid user name gets a hash suffix."""
    plain = PREFIX + tenant
    if _VALID.match(plain) and len(plain) <= _MAX_NAME:
        return plain
    cleaned = re.sub(r"[^a-z0-9_-]+", "-", tenant.lower()).strip("-")
    digest = hashlib.sha256(tenant.encode()).hexdigest()[:8]
    return f"{PREFIX}{cleaned[: _MAX_NAME - len(PREFIX) - 9]}-{digest}".replace("--", "-")


def useradd_command(name: str) -> list[str]:
    return [
        "useradd",
        "--system",
        "--user-group",
        "--no-create-home",
        "--home-dir",
        "/nonexistent",
        "--shell",
        "/usr/sbin/nologin",
        name,
    ]


def managed_user(tenant: str) -> RunAs:
    """The tenant's managed user, created when missing (needs root and ``useradd``).

    ``RunAsError`` says what to run (or configure) when it cannot be made or is root."""
    name = managed_name(tenant)
    fix = (
        f"create it ({' '.join(useradd_command(name))}) or set "
        f"control.tenants.{tenant}.run_as to an unprivileged user"
    )
    if not _exists(name):
        if shutil.which("useradd") is None:
            raise RunAsError(f"tenant {tenant!r} needs user {name!r} and useradd is missing; {fix}")
        done = subprocess.run(useradd_command(name), capture_output=True, text=True, check=False)
        # another server starting at the same moment may have made it: look again
        if done.returncode != 0 and not _exists(name):
            why = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
            raise RunAsError(f"could not create user {name!r} ({why[0]}); {fix}")
    try:
        return resolve_user(name, allow_root=False)
    except RunAsError as exc:
        raise RunAsError(f"managed user {name!r}: {exc}") from None


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
