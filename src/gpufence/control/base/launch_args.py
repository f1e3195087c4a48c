"""The launcher's command line (``Options``, ``parse``) and how its command is confined
(``Confine``: cgroups, identity, working directory), with the exit codes it gives a command that
could not run. Standard library only, like the launcher, which runs by path without ``site``."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from gpufence.control.base.member_records import pty_socket

ALWAYS_CAUGHT = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
"""Signals the launcher survives; ``--catch`` adds more (the executor's notice signal)."""

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_CONTAINED = 125


class SpawnFailure(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class SpawnLost(SpawnFailure):
    """The command never reached the member (a pre-started one whose executor went away
    between waking its launcher and handing its first process the command): nothing of the
    job ran. Recorded with no code, as a lost member, so the attempt is run again rather than
    settled by an exit code of ours: 0 would call a job that never ran done."""


def join_cgroup(directory: str) -> None:
    """Move this process into the cgroup ``directory`` (OSError if refused)."""
    fd = os.open(os.path.join(directory, "cgroup.procs"), os.O_WRONLY)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)


class Confine:
    """Where the user command runs: cgroup directories to join, the identity to take, then the
    working directory to enter (as that identity)."""

    def __init__(self) -> None:
        self.cgroups: list[str] = []
        self.uid: int | None = None
        self.gid: int | None = None
        self.groups: list[int] = []
        self.cwd: str | None = None
        self.terminal: tuple[str, float] | None = None
        """A pty job's (socket, grace): the child is its terminal host (``ptyhost.py``)."""

    def enter(self) -> None:
        """In the forked child, before exec: join every cgroup, drop to the job's user, then
        enter the working directory by its full path as that user, so a directory the user may
        not reach (the server's own, one under a 0700 home) is refused, not entered as root."""
        self.join_cgroups()
        self.become_user()

    def join_cgroups(self) -> None:
        for d in self.cgroups:
            try:
                join_cgroup(d)
            except OSError as exc:
                raise SpawnFailure(EXIT_NOT_CONTAINED, f"cannot join cgroup {d}: {exc}") from exc

    def become_user(self) -> None:
        """The job's groups, gid and uid, then its working directory entered as that user."""
        try:
            if self.gid is not None:
                os.setgroups(self.groups)
                os.setgid(self.gid)
            if self.uid is not None:
                os.setuid(self.uid)
        except OSError as exc:
            raise SpawnFailure(
                EXIT_NOT_CONTAINED, f"cannot switch to uid {self.uid} gid {self.gid}: {exc}"
            ) from exc
        if self.cwd is not None:
            try:
                os.chdir(self.cwd)
            except OSError as exc:
                raise SpawnFailure(
                    EXIT_NOT_CONTAINED,
                    f"cannot enter the working directory {self.cwd} as uid {os.getuid()}: "
                    f"{exc.strerror}",
                ) from exc


class Options:
    """The launcher's command line: where its records go, which rank it runs, the command,
    which signals it survives, the process it is fenced to, and how the command is confined."""

    def __init__(self, attempt_dir: Path, command: list[str]) -> None:
        self.attempt_dir = attempt_dir
        self.command = command
        self.rank: int | None = None
        self.caught: set[signal.Signals] = set(ALWAYS_CAUGHT)
        self.fence_parent: int | None = None
        self.log_limit: int | None = None
        self.confine = Confine()
        self.runtime_monitor = False
        """The command is a container runtime (``containers.py``) whose first process only
        watches the job's: see ``supervisor.outlived_child``."""

    def set(self, opt: str, value: str) -> str | None:
        """Take one ``--opt value``; what is wrong with it, if anything (ValueError: a value
        that is not a number where one is needed)."""
        if opt == "--rank":
            self.rank = int(value)
        elif opt == "--catch":
            self.caught.add(signal.Signals(int(value)))
        elif opt == "--fence-parent":
            self.fence_parent = int(value) or None
        elif opt == "--log-limit":
            self.log_limit = int(value) or None
        elif opt == "--cgroup":
            self.confine.cgroups.append(value)
        elif opt == "--uid":
            self.confine.uid = int(value)
        elif opt == "--gid":
            self.confine.gid = int(value)
        elif opt == "--groups":
            self.confine.groups = [int(g) for g in value.split(",") if g]
        elif opt == "--cwd":
            self.confine.cwd = value
        elif opt == "--pty-grace":
            self.confine.terminal = (str(pty_socket(self.attempt_dir)), float(value))
        elif opt == "--runtime-monitor":
            self.runtime_monitor = value == "1"
        else:
            return f"unknown option {opt}"
        return None


def parse(args: list[str]) -> Options | str:
    """The options of ``args`` (``ATTEMPT_DIR --opt value ... -- COMMAND...``), or what is
    wrong with them."""
    if "--" not in args:
        return "missing '--' before the command"
    split = args.index("--")
    opts, command = args[:split], args[split + 1 :]
    if not command:
        return "empty command"
    if not opts:
        return "missing ATTEMPT_DIR"
    parsed = Options(Path(opts.pop(0)), command)
    while opts:
        opt = opts.pop(0)
        if not opts:
            return f"option {opt} needs a value"
        value = opts.pop(0)
        try:
            problem = parsed.set(opt, value)
        except ValueError:
            return f"bad value for {opt}: {value!r}"
        if problem is not None:
            return problem
    if parsed.rank is None:
        return "missing --rank"
    return parsed


def log_limit_of(argv: list[str]) -> int | None:
    """The ``--log-limit`` a launcher command line sets (None: uncapped, or not a valid one)."""
    parsed = parse(argv)
    return None if isinstance(parsed, str) else parsed.log_limit
