"""The control plane's facade and its wiring: ``control_plane.ControlPlane`` (local executor),
``ray_plane`` (the same on Ray nodes) and ``gpu_runtime`` (the GPU side: NVML, MIG, MPS,
foreign processes)."""

from gpufence.control.plane.control_plane import (
    CALL_TIMEOUT_S,
    AccessError,
    ControlPlane,
    InvalidField,
    NotServingError,
)

__all__ = ["CALL_TIMEOUT_S", "AccessError", "ControlPlane", "InvalidField", "NotServingError"]
