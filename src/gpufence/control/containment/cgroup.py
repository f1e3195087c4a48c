"""What every cgroup mode offers an executor, and the small file helpers the modes share.

A *member cgroup* holds every process of one gang member (the launcher's child joins it before
it execs the job; the launcher stays outside). The executor signals it, kills it, waits until it
is empty (only then are the member's GPUs free again), reads whether the OOM killer struck, and
removes it. ``cgroupv1`` and ``cgroupv2`` implement it on the two kernel interfaces.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

from gpufence.control.base.executor import Limits
from gpufence.control.containment.devicerules import DeviceRule

CPU_PERIOD_US = 100_000
"""CFS period for CPU limits: quota = cpus x period."""


class ContainmentError(RuntimeError):
    """Containment is unavailable or a cgroup operation failed; the message says which and why."""


class MemberCgroup(Protocol):
    """One member's cgroup (see the module docstring)."""

    name: str

    @property
    def join_dirs(self) -> tuple[str, ...]:
        """Directories whose ``cgroup.procs`` the job's first process writes itself into."""
        ...

    def pids(self) -> list[int]:
        """Processes in the cgroup now."""
        ...

    def signal(self, sig: signal.Signals) -> int:
        """Send ``sig`` to every process in it; how many were signalled."""
        ...

    def kill(self) -> int:
        """SIGKILL everything in it, forks racing the kill included; how many processes there
        were. Returns at once: ``empty()`` says when they are gone."""
        ...

    def empty(self) -> bool: ...

    def oom_kills(self) -> int:
        """Processes the OOM killer killed in it for its memory limit."""
        ...

    def cpu_seconds(self) -> float:
        """CPU time used by its processes so far (exited ones included)."""
        ...

    def remove(self) -> bool:
        """Remove the (empty) cgroup; False if the kernel still refuses (try again later)."""
        ...


class CgroupDriver(Protocol):
    """One cgroup mode on this machine: creates and re-opens member cgroups under its parent."""

    mode: str
    """``"v2"`` or ``"v1"``."""
    device_isolation: str
    """How devices are isolated: ``"bpf"``, ``"devices"`` (v1 controller) or ``"off"``."""

    def create(self, name: str, limits: Limits, deny: Sequence[DeviceRule]) -> MemberCgroup:
        """A new (or empty leftover) member cgroup with these limits and denied devices."""
        ...

    def open(self, name: str) -> MemberCgroup | None:
        """The member cgroup ``name`` if it exists (adoption after a restart)."""
        ...

    renames: bool
    """``claim`` works: a cgroup can be renamed with processes inside (v1)."""

    def claim(
        self, spare: MemberCgroup, name: str, limits: Limits, deny: Sequence[DeviceRule]
    ) -> MemberCgroup:
        """Rename the spare cgroup ``spare`` (its processes stay in it) to ``name`` and give it
        these limits and device rules."""
        ...

    def finish(self, member: MemberCgroup) -> None:
        """What ``claim`` leaves for after the job was started (off the hand-off)."""
        ...

    def tidy(self, prefix: str, owner_gone: Callable[[str], bool]) -> None:
        """Remove empty leftovers of claims interrupted by a crash (names ``prefix...``)."""
        ...

    def names(self) -> list[str]:
        """Names of the cgroups under the parent."""
        ...

    def path_of(self, name: str) -> str:
        """The member cgroup ``name`` as ``/proc/PID/cgroup`` shows it (``/PARENT/NAME``, from
        the hierarchy's root; the same in every v1 hierarchy)."""
        ...

    def describe(self) -> str:
        """One line for the log: mode, controllers, where, device isolation."""
        ...

    def release(self) -> None:
        """Remove the parent cgroup if nothing is left in it (best effort)."""
        ...


# ---------------------------------------------------------------------- file helpers
def read(path: Path) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def write(path: Path, text: str) -> None:
    """Write one value to a cgroup file (one ``write``: the kernel parses each write alone)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise ContainmentError(f"cannot write {text.strip()!r} to {path}: {exc.strerror}") from exc


def read_pids(path: Path) -> list[int]:
    text = read(path)
    return [int(x) for x in text.split()] if text else []


def keyed(path: Path, key: str) -> int:
    """The value of ``key`` in a flat-keyed cgroup file (``memory.events``, ``cpu.stat``)."""
    for line in (read(path) or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            with contextlib.suppress(ValueError):
                return int(parts[1])
    return 0


def signal_pids(pids: Iterable[int], sig: signal.Signals) -> int:
    n = 0
    for pid in pids:
        if pid <= 1:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            n += 1
    return n


def cpu_quota_us(limits: Limits) -> int | None:
    if limits.cpus is None:
        return None
    return max(1000, round(limits.cpus * CPU_PERIOD_US))


def make_dir(path: Path, parents: bool = False) -> bool:
    """mkdir; True if it was made now, False if it was there already. With ``parents``, a parent
    removed meanwhile (another executor released it) is made again."""
    for _ in range(3):
        try:
            path.mkdir()
            return True
        except FileExistsError:
            return False
        except FileNotFoundError:
            if not parents:
                raise ContainmentError(f"cannot create cgroup {path}: no parent") from None
            with contextlib.suppress(FileExistsError, OSError):
                path.parent.mkdir(parents=True)
        except OSError as exc:
            raise ContainmentError(f"cannot create cgroup {path}: {exc.strerror}") from exc
    raise ContainmentError(f"cannot create cgroup {path}: its parent keeps disappearing")


def remove_dir(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
