"""What GPU discovery reports: the Discovery / DiscoveredGpu / MigDevice records and its error.

``gpufence.control.gpus.discovery`` makes them (from NVML, or made up with --fake-gpus);
``gpufence.control.gpus.nodespec`` turns them into a one-node cluster spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["CapsTree", "DiscoveredGpu", "Discovery", "DiscoveryError", "MigDevice"]


class DiscoveryError(RuntimeError):
    """No GPU could be discovered, or the discovered GPUs cannot be described as one node."""


@dataclass(frozen=True, slots=True)
class CapsTree:
    """Where the NVIDIA driver publishes the MIG capabilities (a test lays out its own:
    ``gpufence.testing.fake_caps``)."""

    proc: Path = Path("/proc/driver/nvidia/capabilities")
    """One ``access`` file per GPU instance and compute instance that exists
    (``gpuN/mig/giG[/ciC]/access``, holding ``DeviceFileMinor: M``)."""
    minors: Path = Path("/proc/driver/nvidia-caps/mig-minors")
    """The driver's static table of every capability it could ever create, created or not
    (``gpuN/giG/ciC/access M``), fixed when the driver loads."""
    dev: Path = Path("/dev/nvidia-caps")
    """The capability device nodes, ``nvidia-capM``."""


@dataclass(frozen=True, slots=True)
class MigDevice:
    uuid: str  # "MIG-..." (what CUDA_VISIBLE_DEVICES names)
    profile: str  # GPU-instance profile in catalogue naming, e.g. "3g.40gb"
    start: int | None  # placement start (memory slice); None where NVML would not say
    device_nodes: tuple[str, ...] = ()  # its GPU- and compute-instance capability devices


@dataclass(frozen=True, slots=True)
class DiscoveredGpu:
    index: int  # NVML index (PCI bus order)
    uuid: str
    model: str  # NVML name, e.g. "NVIDIA H100 80GB HBM3"
    gpu_type: str | None  # gpufence catalogue type, e.g. "H100-80GB"; None if not in it
    memory_mib: int
    mig_enabled: bool
    mig_devices: tuple[MigDevice, ...]
    nvlink_peers: tuple[int, ...]  # GPUs reached over an active NVLink (directly or via NVSwitch)
    nvlink_reported: bool = True  # False: NVML gave no NVLink state, so peers are unknown
    device_nodes: tuple[str, ...] = ()  # /dev/nvidiaN (fake GPUs: from config, or none)
    minor: int | None = None  # the N of /dev/nvidiaN (NVML); None where unknown (fake GPUs)


@dataclass(frozen=True, slots=True)
class Discovery:
    gpus: tuple[DiscoveredGpu, ...]
    fake: bool
    driver: str | None
    source: str  # one sentence for logs and `status`
    caps: CapsTree = CapsTree()  # where its MIG capabilities are published
