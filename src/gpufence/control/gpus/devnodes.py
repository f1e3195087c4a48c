"""The device nodes of each GPU: what containment lets a job open (and denies the others).

A whole GPU is ``/dev/nvidiaN``, N its minor number (NVML ``nvmlDeviceGetMinorNumber``; not
always its index). A MIG instance needs its parent GPU's node plus two capability devices,
``/dev/nvidia-caps/nvidia-capM`` for its GPU instance and its compute instance, M read from
``/proc/driver/nvidia/capabilities/gpuN/mig/giG[/ciC]/access`` (``DeviceFileMinor: M``). Fake GPUs
get the nodes of ``control.containment.fake_gpu_devices`` (e.g. ``mknod`` test devices), or none.
``/dev/nvidiactl`` and ``/dev/nvidia-uvm*`` are shared by every job and never denied.

What containment denies (``all_nodes``) is fixed when the server starts, but MIG instances come
and go while it runs (the MIG manager re-partitions), so for a MIG GPU it holds every capability
device the driver could ever give that GPU, not just the instances it has now: the driver's
``mig-minors`` table lists them all (15 GPU instances x (1 + 8 compute instances) per GPU,
numbered when the driver loads), whether the instance exists or not.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from gpufence.control.gpus.records import CapsTree, Discovery

DRIVER = CapsTree()
"""Where the NVIDIA driver itself publishes them."""
_MINOR = re.compile(r"DeviceFileMinor:\s*(\d+)")
_TABLE_LINE = re.compile(r"^gpu(\d+)/gi\d+(?:/ci\d+)?/access\s+(\d+)\s*$", re.MULTILINE)


def gpu_node(minor: int) -> str:
    return f"/dev/nvidia{minor}"


def cap_node(minor: int, caps: CapsTree = DRIVER) -> str:
    return str(caps.dev / f"nvidia-cap{minor}")


def _cap_minor(access: Path) -> int | None:
    try:
        m = _MINOR.search(access.read_text(encoding="ascii", errors="replace"))
    except OSError:
        return None
    return int(m.group(1)) if m else None


def mig_nodes(minor: int, gi: int, ci: int | None, caps: CapsTree = DRIVER) -> tuple[str, ...]:
    """The capability devices of MIG GPU instance ``gi`` (and compute instance ``ci``) of the
    GPU whose device node is ``/dev/nvidia<minor>``; those whose access file is missing (the
    instance is gone) are left out."""
    base = caps.proc / f"gpu{minor}" / "mig" / f"gi{gi}"
    found = [_cap_minor(base / "access")]
    if ci is not None:
        found.append(_cap_minor(base / f"ci{ci}" / "access"))
    return tuple(cap_node(m, caps) for m in found if m is not None)


def gpu_mig_caps(minor: int, caps: CapsTree = DRIVER) -> tuple[str, ...]:
    """Every MIG capability device of the GPU ``/dev/nvidia<minor>``: one per GPU instance and
    compute instance the driver could create on it, from its ``mig-minors`` table. Without the
    table (a driver older than MIG) the instances whose access files exist now."""
    try:
        table = caps.minors.read_text(encoding="ascii", errors="replace")
    except OSError:
        table = None
    if table is not None:
        found = [int(m) for gpu, m in _TABLE_LINE.findall(table) if int(gpu) == minor]
    else:
        base = caps.proc / f"gpu{minor}" / "mig"
        files = sorted(base.glob("gi*/access")) + sorted(base.glob("gi*/ci*/access"))
        found = [m for m in map(_cap_minor, files) if m is not None]
    return tuple(cap_node(m, caps) for m in sorted(set(found)))


def all_nodes(discovery: Discovery) -> tuple[str, ...]:
    """Every GPU device node of this machine (containment denies those a member was not given):
    each GPU's ``/dev/nvidiaN`` and, on MIG GPUs, every capability device the GPU has or could
    get after a re-partition (``gpu_mig_caps``).

    Why the whole table rather than the instances the GPU has now, or a list re-derived from
    the ``DeviceMap`` at each launch: a member's device rules are written once, when its cgroup
    is made (v1 ``devices.deny`` lines, also on the pre-started spares; a v2 BPF program
    attached then), and a running member's are never rewritten; an instance the MIG manager
    creates later would be open to every member already running. Denying numbers that no node
    has yet costs nothing and covers them in advance. (One rule per minor: v1 cannot deny a
    whole major and allow some minors back, since in a cgroup that allows by default
    ``devices.allow`` only removes a deny exception that matches exactly.)
    Only MIG-enabled GPUs: MIG mode does not change under a running server (start-up refuses a
    GPU whose mode does not match its partition), and a capability is of no use without its
    parent GPU's node, which is denied to every member not given that GPU.
    """
    out: list[str] = []
    for g in discovery.gpus:
        out += g.device_nodes
        if g.mig_enabled and g.minor is not None:
            out += gpu_mig_caps(g.minor, discovery.caps)
        for m in g.mig_devices:
            out += m.device_nodes
    return tuple(dict.fromkeys(out))


def with_fake_nodes(discovery: Discovery, template: str | None) -> Discovery:
    """Fake GPUs with the device nodes of ``template`` (``{index}`` replaced); as is if None."""
    if not discovery.fake or template is None:
        return discovery
    gpus = tuple(replace(g, device_nodes=(template.format(index=g.index),)) for g in discovery.gpus)
    return replace(discovery, gpus=gpus)
