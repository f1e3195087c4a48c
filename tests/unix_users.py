"""Real Unix users for tests: created with ``useradd`` under unique names, removed afterwards.

Several test sessions may share the machine, so every name carries this process's pid and a
random suffix. Needs root and ``useradd``; otherwise the test is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("creating Unix users for run_as needs root")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel are not installed")


def _kill_processes_of(uid: int) -> None:
    """SIGKILL what still runs as this test's own throw-away user (a failed test's job)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    os.kill(int(entry), signal.SIGKILL)


@contextlib.contextmanager
def unix_users(*suffixes: str) -> Iterator[list[User]]:
    """One new user per suffix (``gf<pid><rand><suffix>``, no home, no login shell)."""
    _need_root()
    tag = f"gf{os.getpid()}{secrets.token_hex(2)}"
    made: list[str] = []
    try:
        for s in suffixes:
            name = f"{tag}{s}"
            subprocess.run(
                [
                    "useradd",
                    "--no-create-home",
                    "--user-group",
                    "--shell",
                    "/usr/sbin/nologin",
                    name,
                ],
                check=True,
                capture_output=True,
            )
            made.append(name)
        yield [User(n, pwd.getpwnam(n).pw_uid, pwd.getpwnam(n).pw_gid) for n in made]
    finally:
        for name in made:
            _kill_processes_of(pwd.getpwnam(name).pw_uid)  # else userdel refuses: a leak
            subprocess.run(["userdel", name], check=False, capture_output=True)
            subprocess.run(["groupdel", name], check=False, capture_output=True)


MANAGED_PREFIX = "gpufence-"  # = tenant_users.PREFIX: the users a root server makes itself


def managed_users() -> set[str]:
    """The ``gpufence-<tenant>`` users on this machine now."""
    return {p.pw_name for p in pwd.getpwall() if p.pw_name.startswith(MANAGED_PREFIX)}


def _in_use(uid: int) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    return True
    return False


@contextlib.contextmanager
def managed_users_removed() -> Iterator[set[str]]:
    """Remove the managed users (and their groups) that appeared while the block ran: a root
    ``gpufence up`` or ``control_config`` without ``run_as`` creates ``gpufence-<tenant>``
    (``tenant_users.py``), and a test that makes it do so must not leave the users behind.
    Yields the set of those removed (filled at the end). A user some process still runs as is
    left (another test session on this machine may be using it) -- nothing is killed here."""
    before = managed_users()
    removed: set[str] = set()
    try:
        yield removed
    finally:
        for name in sorted(managed_users() - before):
            with contextlib.suppress(KeyError):
                if _in_use(pwd.getpwnam(name).pw_uid):
                    continue
            done = subprocess.run(["userdel", name], check=False, capture_output=True)
            subprocess.run(["groupdel", name], check=False, capture_output=True)
            if done.returncode == 0:
                removed.add(name)
