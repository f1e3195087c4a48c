"""cgroup v1: one directory per member in each of the cpu, cpuacct, memory, pids, devices and
freezer hierarchies, all named ``PARENT/NAME``.

Limits: ``cpu.cfs_quota_us`` over a 100 ms ``cpu.cfs_period_us``, ``memory.limit_in_bytes`` (and
``memory.memsw.limit_in_bytes``, so a job cannot swap past it), ``pids.max``. Devices: one
``devices.deny`` line per denied GPU node (the member's cgroup otherwise keeps its parent's
rules). Kill: the freezer stops every process (so none forks while it is killed), each gets
SIGKILL, then the cgroup is thawed and they die. OOM kills: ``oom_kill`` in
``memory.oom_control``. Processes are listed from the freezer hierarchy (all hierarchies hold the
same ones: the job's first process joins them all before exec).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gpufence.control.base.executor import Limits
from gpufence.control.base.member_records import proc_stat_fields
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

REQUIRED = ("cpu", "memory", "pids", "freezer")
OPTIONAL = ("cpuacct", "devices")
FREEZE_WAIT_S = 0.2
"""How long ``kill`` waits for the freezer to report FROZEN before killing anyway."""
_CLK_TCK = os.sysconf("SC_CLK_TCK")


class V1Member:
    def __init__(
        self,
        name: str,
        dirs: dict[str, Path],
        limits: Limits | None = None,
        deny: Sequence[DeviceRule] = (),
    ) -> None:
        self.name = name
        self._dirs = dirs
        self._procs = dirs["freezer"] / "cgroup.procs"
        self.limits = limits
        """What it was given (None: not known, e.g. re-opened after a restart)."""
        self.deny = frozenset(deny)
        self._pending: dict[str, Path] = {}
        """Hierarchies still to rename (``V1Driver.claim``): done by ``finish``, which every
        method that reads them calls first (another thread may be about to)."""
        self._lock = threading.Lock()

    def finish(self) -> None:
        """Rename the hierarchies ``claim`` left (a failed rename leaves the spare's name
        there: ``V1Driver.tidy`` removes it once empty)."""
        with self._lock:
            for ctrl, new in list(self._pending.items()):
                with contextlib.suppress(OSError):
                    os.rename(self._dirs[ctrl], new)
                    self._dirs[ctrl] = new
                del self._pending[ctrl]

    def _dir(self, ctrl: str) -> Path | None:
        if self._pending:
            self.finish()
        return self._dirs.get(ctrl)

    @property
    def join_dirs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(str(d) for d in self._dirs.values()))

    def pids(self) -> list[int]:
        return read_pids(self._procs)

    def signal(self, sig: signal.Signals) -> int:
        return signal_pids(self.pids(), sig)

    def kill(self) -> int:
        pids = self.pids()
        if not pids:
            return 0
        state = self._dirs["freezer"] / "freezer.state"
        frozen = False
        with contextlib.suppress(ContainmentError):
            write(state, "FROZEN")
            frozen = True
        end = time.monotonic() + FREEZE_WAIT_S
        while frozen and (read(state) or "").strip() != "FROZEN" and time.monotonic() < end:
            time.sleep(0.001)
        found = set(pids)
        for _ in range(3):  # a process forked before the freeze completed shows up here
            now = self.pids()
            found.update(now)
            signal_pids(now, signal.SIGKILL)
            if not frozen:
                break
        if frozen:
            with contextlib.suppress(ContainmentError):
                write(state, "THAWED")
        return len(found)

    def empty(self) -> bool:
        return not self.pids()

    def oom_kills(self) -> int:
        mem = self._dir("memory")
        return keyed(mem / "memory.oom_control", "oom_kill") if mem is not None else 0

    def cpu_seconds(self) -> float:
        acct = self._dir("cpuacct")
        text = read(acct / "cpuacct.usage") if acct is not None else None
        if text and text.strip().isdigit():
            return int(text) / 1e9
        ticks = 0
        for pid in self.pids():  # no cpuacct: the live processes only
            fields = proc_stat_fields(pid)
            if fields is not None and len(fields) >= 15:
                ticks += sum(int(f) for f in fields[11:15])
        return ticks / _CLK_TCK

    def remove(self) -> bool:
        if self._pending:
            self.finish()
        ok = True
        for d in dict.fromkeys(self._dirs.values()):
            ok = remove_dir(d) and ok
        return ok


def _cgroups_of(pid: int) -> dict[str, str]:
    """Controller -> cgroup path of process ``pid`` (``/proc/PID/cgroup``)."""
    out: dict[str, str] = {}
    for line in (read(Path(f"/proc/{pid}/cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctrl in parts[1].split(","):
                out[ctrl] = parts[2]
    return out


class V1Driver:
    """Member cgroups under ``PARENT`` in each v1 hierarchy (see the module docstring)."""

    mode = "v1"

    def __init__(self, mounts: dict[str, Path], parent: str) -> None:
        self._mounts = dict(mounts)
        self._parent = parent.strip("/")
        self._roots = {c: mounts[c] / self._parent for c in (*REQUIRED, *OPTIONAL) if c in mounts}
        self.device_isolation = "devices" if "devices" in self._roots else "off"

    @classmethod
    def probe(cls, mounts: dict[str, Path], parent: str) -> V1Driver:
        """The driver if every required hierarchy is mounted and usable; else ContainmentError."""
        lacking = [c for c in REQUIRED if c not in mounts]
        if lacking:
            raise ContainmentError(f"cgroup v1: no {', '.join(lacking)} hierarchy mounted")
        drv = cls(mounts, parent)
        probe = f"probe-{os.getpid()}-{os.urandom(3).hex()}"
        for ctrl, root in drv._roots.items():
            try:
                root.mkdir(parents=True, exist_ok=True)
                (root / probe).mkdir()
                (root / probe).rmdir()
            except OSError as exc:
                raise ContainmentError(
                    f"cgroup v1: cannot create cgroups in {root} ({ctrl}): {exc.strerror}"
                ) from exc
        return drv

    def _dirs(self, name: str) -> dict[str, Path]:
        return {c: root / name for c, root in self._roots.items()}

    def create(self, name: str, limits: Limits, deny: Sequence[DeviceRule]) -> V1Member:
        dirs = self._dirs(name)
        made: list[Path] = []
        try:
            for d in dirs.values():
                if make_dir(d, parents=True):
                    made.append(d)
            member = V1Member(name, dirs, limits, deny)
            if member.pids():
                raise ContainmentError(f"cgroup {dirs['freezer']} already holds processes")
            self._limit(dirs, limits)
            if "devices" in dirs:
                for rule in deny:
                    write(dirs["devices"] / "devices.deny", rule.v1())
        except BaseException:
            for d in made:
                remove_dir(d)
            raise
        return member

    renames = True
    """A member cgroup can be renamed with its processes inside (``claim``)."""

    def claim(
        self, spare: object, name: str, limits: Limits, deny: Sequence[DeviceRule]
    ) -> V1Member:
        """Make a spare (pre-joined) cgroup the member's, writing only what differs from what
        the spare was given: the freezer directory (the member's identity: adoption and the
        spare sweep go by it) is renamed to ``name`` now, the other hierarchies by ``finish``,
        after the job was started (no process moves either way: see ``prestart.py``)."""
        assert isinstance(spare, V1Member)
        new = self._dirs(name)
        for d in new.values():  # left by an earlier life of this name (a crash, a lost store)
            if d.is_dir():
                if read_pids(d / "cgroup.procs"):
                    raise ContainmentError(f"cgroup {d} already holds processes")
                remove_dir(d)
        try:
            os.rename(spare._dirs["freezer"], new["freezer"])
        except OSError as exc:
            raise ContainmentError(f"cannot rename cgroup {spare.name} to {name}: {exc}") from exc
        dirs = {**spare._dirs, "freezer": new["freezer"]}
        member = V1Member(name, dirs, limits, deny)
        member._pending = {c: d for c, d in new.items() if c != "freezer"}
        if spare.limits is None or spare.limits != limits:
            self._limit(dirs, limits)
        if "devices" in dirs:
            for rule in sorted(spare.deny - member.deny):
                write(dirs["devices"] / "devices.allow", rule.v1())
            for rule in sorted(member.deny - spare.deny):
                write(dirs["devices"] / "devices.deny", rule.v1())
        return member

    def finish(self, member: object) -> None:
        """The renames ``claim`` left for after the start."""
        assert isinstance(member, V1Member)
        member.finish()

    def tidy(self, prefix: str, owner_gone: Callable[[str], bool]) -> None:
        """Remove the empty directories named ``prefix...`` of gone owners that a claim left in
        the other hierarchies (their freezer directory was renamed; a crash came before
        ``finish``)."""
        for ctrl, root in self._roots.items():
            if ctrl == "freezer":
                continue
            with contextlib.suppress(OSError):
                for d in root.iterdir():
                    claimed = not (self._roots["freezer"] / d.name).exists()
                    if d.name.startswith(prefix) and owner_gone(d.name) and claimed:
                        remove_dir(d)

    def path_of(self, name: str) -> str:
        return f"/{self._parent}/{name}"

    def names(self) -> list[str]:
        """Names of the cgroups under the parent (from the freezer hierarchy)."""
        try:
            return [d.name for d in self._roots["freezer"].iterdir() if d.is_dir()]
        except OSError:
            return []

    def _limit(self, dirs: dict[str, Path], limits: Limits) -> None:
        quota = cpu_quota_us(limits)
        write(dirs["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
        write(dirs["cpu"] / "cpu.cfs_quota_us", str(quota if quota is not None else -1))
        mem = dirs["memory"]
        memsw = mem / "memory.memsw.limit_in_bytes"
        value = str(limits.mem_bytes) if limits.mem_bytes is not None else "-1"
        # memsw must stay >= limit_in_bytes: raise memsw first, lower it last
        if memsw.exists():
            write(memsw, "-1")
        write(mem / "memory.limit_in_bytes", value)
        if memsw.exists() and limits.mem_bytes is not None:
            write(memsw, value)
        write(dirs["pids"] / "pids.max", str(limits.pids) if limits.pids is not None else "max")

    def open(self, name: str) -> V1Member | None:
        dirs = self._dirs(name)
        if not dirs["freezer"].is_dir():
            return None
        member = V1Member(name, dirs)
        missing = {c for c, d in dirs.items() if not d.is_dir()}
        pids = member.pids() if missing else []
        if pids:  # a claim a crash interrupted: the other hierarchies still have the spare's name
            found = _cgroups_of(pids[0])
            for ctrl in missing:
                if ctrl in found:
                    dirs[ctrl] = self._mounts[ctrl] / found[ctrl].lstrip("/")
        return member

    def describe(self) -> str:
        ctrls = ", ".join(self._roots)
        devices = (
            "v1 devices controller"
            if self.device_isolation == "devices"
            else "OFF (no v1 devices hierarchy)"
        )
        return f"cgroup v1 ({ctrls}) under /{self._parent}; device isolation: {devices}"

    def release(self) -> None:
        for root in self._roots.values():
            remove_dir(root)
