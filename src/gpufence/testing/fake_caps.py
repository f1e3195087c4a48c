"""The NVIDIA driver's MIG capability files, laid out in a test's directory.

What the driver publishes (and ``control/gpus/devnodes.py`` reads), at the paths of a
``CapsTree``:

* ``mig-minors`` (the driver's ``/proc/driver/nvidia-caps/mig-minors``): every capability the
  driver could ever create, numbered once when it loads: minor 0 is NVLink fabric management, 1
  and 2 the MIG ``config`` and ``monitor`` capabilities, then for each of 32 GPUs (by minor
  number) 15 GPU instances, each followed by its 8 compute instances (``gpuN/giG/access``,
  ``gpuN/giG/ciC/access``), whether the instance exists or not;
* ``capabilities/gpuN/mig/giG[/ciC]/access`` (``/proc/driver/nvidia/capabilities``): only while
  the instance exists, holding ``DeviceFileMinor: M``. ``FakeNvml(caps=...)`` rewrites them after
  every instance it creates or destroys (``sync``);
* ``nvidia-caps/`` (``/dev/nvidia-caps``): where the nodes ``nvidia-capM`` go; a test that
  needs them makes them itself (``mknod``, as root).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from gpufence.control.gpus.records import CapsTree

GPUS = 32
GPU_INSTANCES = 15
COMPUTE_INSTANCES = 8
_FIRST = 3  # after fabric-mgmt (0), mig config (1) and mig monitor (2)
_PER_GI = 1 + COMPUTE_INSTANCES
_PER_GPU = GPU_INSTANCES * _PER_GI


def minor_of(gpu: int, gi: int, ci: int | None = None) -> int:
    """The driver's minor of GPU instance ``gi`` (or its compute instance ``ci``) of GPU
    ``gpu``."""
    return _FIRST + gpu * _PER_GPU + gi * _PER_GI + (0 if ci is None else 1 + ci)


class FakeCaps:
    """A driver's capability files under ``root`` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.tree = CapsTree(
            proc=root / "capabilities", minors=root / "mig-minors", dev=root / "nvidia-caps"
        )
        root.mkdir(parents=True, exist_ok=True)
        self.tree.proc.mkdir(exist_ok=True)
        self.tree.dev.mkdir(exist_ok=True)
        lines = ["config 1", "monitor 2"]
        for gpu in range(GPUS):
            for gi in range(GPU_INSTANCES):
                lines.append(f"gpu{gpu}/gi{gi}/access {minor_of(gpu, gi)}")
                lines += [
                    f"gpu{gpu}/gi{gi}/ci{ci}/access {minor_of(gpu, gi, ci)}"
                    for ci in range(COMPUTE_INSTANCES)
                ]
        self.tree.minors.write_text("\n".join(lines) + "\n", encoding="ascii")

    def node(self, gpu: int, gi: int, ci: int | None = None) -> str:
        """The device node path of that capability."""
        return str(self.tree.dev / f"nvidia-cap{minor_of(gpu, gi, ci)}")

    def sync(self, instances: Iterable[tuple[int, int, int | None]]) -> None:
        """Make the access files those of ``instances`` exactly: (GPU minor, GPU instance ID,
        compute instance ID, or None for the GPU instance itself)."""
        for old in self.tree.proc.glob("gpu*"):
            shutil.rmtree(old)
        for gpu, gi, ci in instances:
            d = self.tree.proc / f"gpu{gpu}" / "mig" / f"gi{gi}"
            if ci is not None:
                d = d / f"ci{ci}"
            d.mkdir(parents=True, exist_ok=True)
            text = f"DeviceFileMinor: {minor_of(gpu, gi, ci)}\nDeviceFileMode: 292\n"
            (d / "access").write_text(text, encoding="ascii")
