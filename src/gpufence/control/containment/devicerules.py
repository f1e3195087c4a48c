"""Device isolation rules: which device nodes a member may not open.

The rule follows Slurm's ``ConstrainDevices``: every GPU device node of this machine (whole GPUs'
``/dev/nvidiaN``, MIG capability devices ``/dev/nvidia-caps/nvidia-capN``) is denied except the
member's own; everything else (``/dev/null``, ``/dev/nvidiactl``, ``/dev/nvidia-uvm*``, NICs'
``/dev/infiniband/*``) stays as the parent cgroup has it. A rule names the device by type and
number, not path: a job that ``mknod``s its own node for another GPU is refused the same way.

A MIG capability device need not exist as a node yet (nvidia-modprobe makes
``/dev/nvidia-caps/nvidia-capM`` when the instance is first used, and the MIG manager creates
instances while the server runs), yet its number is known: the driver's ``nvidia-caps`` major
(``/proc/devices``) and M. So a missing node there still gets its rule, and a member's cgroup
denies (or allows) the instance before the node appears.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CAPS_DEV = Path("/dev/nvidia-caps")
PROC_DEVICES = Path("/proc/devices")
_CAP_NAME = re.compile(r"nvidia-cap(\d+)")
_majors: dict[Path, int] = {}  # found once per file: a driver's major is fixed while it is loaded


@dataclass(frozen=True, slots=True, order=True)
class DeviceRule:
    kind: str
    """``"c"`` (character) or ``"b"`` (block)."""
    major: int
    minor: int

    def v1(self) -> str:
        """The line for v1 ``devices.deny`` / ``devices.allow``."""
        return f"{self.kind} {self.major}:{self.minor} rwm"


def caps_major(devices: Path = PROC_DEVICES) -> int | None:
    """The character device major of the NVIDIA capability devices (``nvidia-caps`` in
    ``/proc/devices``); None where that driver is not loaded."""
    if devices in _majors:
        return _majors[devices]
    try:
        text = devices.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    chars = text.split("Block devices:")[0]
    for line in chars.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1] == "nvidia-caps":
            _majors[devices] = int(parts[0])
            return _majors[devices]
    return None


def _absent_cap(path: str) -> DeviceRule | None:
    """The rule of a MIG capability device that has no node yet (see the module docstring)."""
    p = Path(path)
    m = _CAP_NAME.fullmatch(p.name)
    if m is None or p.parent != CAPS_DEV:
        return None
    major = caps_major(PROC_DEVICES)
    return None if major is None else DeviceRule("c", major, int(m.group(1)))


def rule_of(path: str) -> DeviceRule | None:
    """The rule for the device node at ``path``; None if there is no device node there (but a
    MIG capability device without its node yet gets one by its number)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return _absent_cap(path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:
        return None
    return DeviceRule(kind, os.major(st.st_rdev), os.minor(st.st_rdev))


def denied(all_gpu_nodes: Iterable[str], own_nodes: Iterable[str]) -> tuple[DeviceRule, ...]:
    """Rules for the GPU device nodes of this machine that are not the member's own."""
    own = {r for r in map(rule_of, own_nodes) if r is not None}
    every = {r for r in map(rule_of, all_gpu_nodes) if r is not None}
    return tuple(sorted(every - own))


def missing(nodes: Iterable[str]) -> list[str]:
    """The paths of ``nodes`` that are not device nodes (logged: isolation cannot cover them)."""
    return [p for p in nodes if rule_of(p) is None]
