"""Where this machine mounts its cgroup hierarchies (``/proc/self/mounts``).

cgroup v1 mounts one hierarchy per controller (or a few co-mounted, ``cpu,cpuacct``), each a
``cgroup`` file system whose mount options name its controllers; cgroup v2 is one ``cgroup2``
file system (``/sys/fs/cgroup`` on a pure v2 machine, ``/sys/fs/cgroup/unified`` on a hybrid one),
whose controllers are listed in its ``cgroup.controllers``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpufence.control.containment.cgroup import read

V1_CONTROLLERS = ("cpu", "cpuacct", "memory", "pids", "devices", "freezer")
"""The v1 controllers gpufence uses (cpuset, blkio and others are left alone)."""


@dataclass(frozen=True, slots=True)
class CgroupMounts:
    v1: dict[str, Path] = field(default_factory=dict)
    """Controller -> mount point of its hierarchy (co-mounted ones share a path)."""
    v2: Path | None = None
    """Mount point of the unified hierarchy, if any."""

    def v2_controllers(self) -> frozenset[str]:
        """Controllers the unified hierarchy's root offers (bound to v1 ones are missing)."""
        if self.v2 is None:
            return frozenset()
        return frozenset((read(self.v2 / "cgroup.controllers") or "").split())


def parse(text: str) -> CgroupMounts:
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        where = Path(parts[1].replace("\\040", " "))
        if parts[2] == "cgroup2" and v2 is None:
            v2 = where
        elif parts[2] == "cgroup":
            for opt in parts[3].split(","):
                if opt in V1_CONTROLLERS and opt not in v1:
                    v1[opt] = where
    return CgroupMounts(v1, v2)


def current() -> CgroupMounts:
    """This machine's mounts (none where ``/proc/self/mounts`` cannot be read)."""
    return parse(read(Path("/proc/self/mounts")) or "")
