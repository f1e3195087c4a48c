"""Which containment this machine offers, decided once at start-up.

``detect`` tries cgroup v2 first (a unified hierarchy with the cpu, memory and pids controllers),
then the v1 controllers (cpu, memory, pids and freezer; devices for device isolation). If neither
works it raises ``ContainmentError`` with every reason and the way out (``--no-containment``,
which runs jobs unconfined: no limits, no device isolation, and a job's processes can outlive it).
"""

from __future__ import annotations

from gpufence.control.base.containment_settings import ContainmentSettings
from gpufence.control.containment import mounts as _mounts
from gpufence.control.containment.cgroup import CgroupDriver, ContainmentError
from gpufence.control.containment.cgroupv1 import V1Driver
from gpufence.control.containment.cgroupv2 import V2Driver

NO_CONTAINMENT_HINT = (
    "run gpufence up as root on a machine with cgroup v2 (cpu, memory, pids controllers) or the "
    "cgroup v1 cpu, memory, pids and freezer hierarchies; or start it with --no-containment "
    "(jobs then run unconfined: no CPU/memory limits, no device isolation, and processes a job "
    "leaves behind are not found)"
)


def detect(
    settings: ContainmentSettings, found: _mounts.CgroupMounts | None = None
) -> CgroupDriver:
    """The driver for this machine (``settings.mode`` may force one); ContainmentError if none."""
    m = found if found is not None else _mounts.current()
    reasons: list[str] = []
    if settings.mode in ("auto", "v2"):
        if m.v2 is None:
            reasons.append("cgroup v2: no cgroup2 file system mounted")
        else:
            try:
                return V2Driver.probe(m.v2, settings.cgroup_parent)
            except ContainmentError as exc:
                reasons.append(str(exc))
    if settings.mode in ("auto", "v1"):
        try:
            return V1Driver.probe(m.v1, settings.cgroup_parent)
        except ContainmentError as exc:
            reasons.append(str(exc))
    raise ContainmentError(
        "no usable cgroup containment on this machine: "
        + "; ".join(reasons)
        + f".\n  To fix: {NO_CONTAINMENT_HINT}"
    )
