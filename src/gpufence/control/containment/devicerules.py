"""Device isolation rules: which device nodes a member may not open.

The rule follows Slurm's ``ConstrainDevices``: every GPU device node of this machine (whole GPUs'
``/dev/nvidiaN``, MIG capability devices ``/dev/nvidia-caps/nvidia-capN``) is denied except the
member's own; everything else (``/dev/null``, ``/dev/nvidiactl``, ``/dev/nvidia-uvm*``, NICs'
``/dev/infiniband/*``) stays as the parent cgroup has it. A rule names the device by type and
number, not path: a job that ``mknod``s its own node for another GPU is refused the same way.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class DeviceRule:
    kind: str
    """``"c"`` (character) or ``"b"`` (block)."""
    major: int
    minor: int

    def v1(self) -> str:
        """The line for v1 ``devices.deny`` / ``devices.allow``."""
        return f"{self.kind} {self.major}:{self.minor} rwm"


def rule_of(path: str) -> DeviceRule | None:
    """The rule for the device node at ``path``; None if there is no device node there."""
    try:
        st = os.stat(path)
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
