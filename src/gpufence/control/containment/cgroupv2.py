"""cgroup v2: one directory per member, ``PARENT/NAME`` in the unified hierarchy.

Limits: ``cpu.max`` (quota and a 100 ms period), ``memory.max`` with ``memory.swap.max`` 0,
``pids.max``; the parent gets the controllers in its ``cgroup.subtree_control`` (and so do its
ancestors, where they lack them). Devices: a BPF device program (``bpfdev``) when the kernel
loads one for us, else device isolation is off (and the log says so). Kill: ``cgroup.kill``
(kernel 5.14+; it also gets processes forked while it runs), else freeze + SIGKILL each + thaw.
Empty: ``populated 0`` in ``cgroup.events``. OOM kills: ``oom_kill`` in ``memory.events``.

The driver also runs on a unified hierarchy without controllers (a hybrid machine's
``/sys/fs/cgroup/unified``): tracking, kill and BPF device isolation work there, limits do not
(``create`` refuses a limit whose controller is missing).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gpufence.control.base.executor import Limits
from gpufence.control.containment import bpfdev
from gpufence.control.containment.cgroup import (
    CPU_PERIOD_US,
    ContainmentError,
    cpu_quota_us,
    keyed,
    make_dir,
    read,
    read_pids,
    remove_dir,
    signal_pids,
    write,
)
from gpufence.control.containment.devicerules import DeviceRule

REQUIRED = ("cpu", "memory", "pids")
FREEZE_WAIT_S = 0.2


class V2Member:
    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = path

    @property
    def join_dirs(self) -> tuple[str, ...]:
        return (str(self.path),)

    def pids(self) -> list[int]:
        return read_pids(self.path / "cgroup.procs")

    def signal(self, sig: signal.Signals) -> int:
        return signal_pids(self.pids(), sig)

    def kill(self) -> int:
        pids = self.pids()
        if not pids:
            return 0
        found = set(pids)
        if (self.path / "cgroup.kill").exists():
            write(self.path / "cgroup.kill", "1")
            return len(found)
        write(self.path / "cgroup.freeze", "1")
        end = time.monotonic() + FREEZE_WAIT_S
        while keyed(self.path / "cgroup.events", "frozen") != 1 and time.monotonic() < end:
            time.sleep(0.001)
        now = self.pids()
        found.update(now)
        signal_pids(now, signal.SIGKILL)
        write(self.path / "cgroup.freeze", "0")
        return len(found)

    def empty(self) -> bool:
        events = self.path / "cgroup.events"
        if not events.exists():
            return True
        return keyed(events, "populated") == 0

    def oom_kills(self) -> int:
        return keyed(self.path / "memory.events", "oom_kill")

    def cpu_seconds(self) -> float:
        return keyed(self.path / "cpu.stat", "usage_usec") / 1e6

    def remove(self) -> bool:
        return remove_dir(self.path)


class V2Driver:
    """Member cgroups under ``MOUNT/PARENT`` (see the module docstring)."""

    mode = "v2"

    def __init__(
        self, mount: Path, parent: str, controllers: frozenset[str], bpf_error: str | None
    ) -> None:
        self._mount = mount
        self._parent_rel = parent.strip("/")
        self._parent = mount / self._parent_rel
        self.controllers = controllers
        self.bpf_error = bpf_error
        self.device_isolation = "bpf" if bpf_error is None else "off"

    @classmethod
    def probe(cls, mount: Path, parent: str, required: Sequence[str] = REQUIRED) -> V2Driver:
        """The driver if the unified hierarchy offers ``required`` to ``PARENT``'s children."""
        offered = frozenset((read(mount / "cgroup.controllers") or "").split())
        lacking = [c for c in required if c not in offered]
        if lacking:
            raise ContainmentError(
                f"cgroup v2 at {mount}: no {', '.join(lacking)} controller "
                f"(offered: {', '.join(sorted(offered)) or 'none'})"
            )
        want = [c for c in REQUIRED if c in offered]
        path = mount
        for part in [*parent.strip("/").split("/"), ""]:
            enabled = set((read(path / "cgroup.subtree_control") or "").split())
            missing = [c for c in want if c not in enabled]
            if missing:  # e.g. EBUSY: this cgroup holds processes ("no internal processes")
                try:
                    write(path / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
                except ContainmentError as exc:
                    raise ContainmentError(
                        f"cgroup v2: cannot enable {', '.join(missing)} for the children of "
                        f"{path}: {exc}"
                    ) from None
            if not part:
                break
            path = path / part
            make_dir(path)
        probe = path / f"probe-{os.getpid()}-{os.urandom(3).hex()}"
        make_dir(probe)
        remove_dir(probe)
        return cls(mount, parent, frozenset(want), bpfdev.probe())

    def create(self, name: str, limits: Limits, deny: Sequence[DeviceRule]) -> V2Member:
        for what, value, ctrl in (
            ("a CPU limit", limits.cpus if "cpus" not in limits.defaulted else None, "cpu"),
            (
                "a memory limit",
                limits.mem_bytes if "mem_bytes" not in limits.defaulted else None,
                "memory",
            ),
            ("a pids limit", limits.pids, "pids"),
        ):
            if value is not None and ctrl not in self.controllers:
                raise ContainmentError(
                    f"{what} needs the {ctrl} controller, which {self._mount} does not offer"
                )
        path = self._parent / name
        made = make_dir(path, parents=True)
        member = V2Member(name, path)
        try:
            if member.pids():
                raise ContainmentError(f"cgroup {path} already holds processes")
            self._limit(path, limits)
            if deny and self.bpf_error is None:
                try:
                    bpfdev.attach(path, deny)
                except bpfdev.BpfError as exc:
                    raise ContainmentError(
                        f"cannot attach the device program to {path}: {exc}"
                    ) from None
        except BaseException:
            if made:
                remove_dir(path)
            raise
        return member

    renames = False
    """cgroup v2 refuses to rename a cgroup: no pre-started members (see ``prestart.py``)."""

    def claim(
        self, spare: object, name: str, limits: Limits, deny: Sequence[DeviceRule]
    ) -> V2Member:
        raise ContainmentError("cgroup v2 cannot rename a cgroup")

    def finish(self, member: object) -> None:
        """Nothing left to do after a start (no claims on v2)."""

    def tidy(self, prefix: str, owner_gone: Callable[[str], bool]) -> None:
        """No spares on v2: nothing to tidy."""

    def path_of(self, name: str) -> str:
        return f"/{self._parent_rel}/{name}"

    def names(self) -> list[str]:
        try:
            return [d.name for d in self._parent.iterdir() if d.is_dir()]
        except OSError:
            return []

    def _limit(self, path: Path, limits: Limits) -> None:
        if "cpu" in self.controllers:
            quota = cpu_quota_us(limits)
            write(path / "cpu.max", f"{quota if quota is not None else 'max'} {CPU_PERIOD_US}")
        if "memory" in self.controllers:
            mem = str(limits.mem_bytes) if limits.mem_bytes is not None else "max"
            write(path / "memory.max", mem)
            if (path / "memory.swap.max").exists():
                write(path / "memory.swap.max", "0" if limits.mem_bytes is not None else "max")
        if "pids" in self.controllers:
            write(path / "pids.max", str(limits.pids) if limits.pids is not None else "max")

    def open(self, name: str) -> V2Member | None:
        path = self._parent / name
        return V2Member(name, path) if path.is_dir() else None

    def describe(self) -> str:
        ctrls = ", ".join(sorted(self.controllers)) or "no controllers: limits off"
        devices = "BPF device program" if self.bpf_error is None else f"OFF: {self.bpf_error}"
        return f"cgroup v2 ({ctrls}) under {self._parent}; device isolation: {devices}"

    def release(self) -> None:
        with contextlib.suppress(OSError):
            remove_dir(self._parent)
