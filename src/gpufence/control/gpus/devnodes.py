"""The device nodes of each GPU: what containment lets a job open (and denies the others).

A whole GPU is ``/dev/nvidiaN``, N its minor number (NVML ``nvmlDeviceGetMinorNumber``; not
always its index). A MIG instance needs its parent GPU's node plus two capability devices,
``/dev/nvidia-caps/nvidia-capM`` for its GPU instance and its compute instance, M read from
``/proc/driver/nvidia/capabilities/gpuN/mig/giG[/ciC]/access`` (``DeviceFileMinor: M``). Fake GPUs
get the nodes of ``control.containment.fake_gpu_devices`` (e.g. ``mknod`` test devices), or none.
``/dev/nvidiactl`` and ``/dev/nvidia-uvm*`` are shared by every job and never denied.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from gpufence.control.gpus.records import Discovery

CAPS = Path("/proc/driver/nvidia/capabilities")
_MINOR = re.compile(r"DeviceFileMinor:\s*(\d+)")


def gpu_node(minor: int) -> str:
    return f"/dev/nvidia{minor}"


def _cap_node(access: Path) -> str | None:
    try:
        m = _MINOR.search(access.read_text(encoding="ascii", errors="replace"))
    except OSError:
        return None
    return f"/dev/nvidia-caps/nvidia-cap{m.group(1)}" if m else None


def mig_nodes(minor: int, gi: int, ci: int | None, caps: Path = CAPS) -> tuple[str, ...]:
    """The capability devices of MIG GPU instance ``gi`` (and compute instance ``ci``)."""
    base = caps / f"gpu{minor}" / "mig" / f"gi{gi}"
    found = [_cap_node(base / "access")]
    if ci is not None:
        found.append(_cap_node(base / f"ci{ci}" / "access"))
    return tuple(n for n in found if n is not None)


def all_nodes(discovery: Discovery) -> tuple[str, ...]:
    """Every GPU device node of this machine (containment denies those a member was not given)."""
    out: list[str] = []
    for g in discovery.gpus:
        out += g.device_nodes
        for m in g.mig_devices:
            out += m.device_nodes
    return tuple(dict.fromkeys(out))


def with_fake_nodes(discovery: Discovery, template: str | None) -> Discovery:
    """Fake GPUs with the device nodes of ``template`` (``{index}`` replaced); as is if None."""
    if not discovery.fake or template is None:
        return discovery
    gpus = tuple(replace(g, device_nodes=(template.format(index=g.index),)) for g in discovery.gpus)
    return replace(discovery, gpus=gpus)
