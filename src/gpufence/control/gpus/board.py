"""What the control plane knows about each GPU and partition beyond the scheduler's ledger.

The MIG manager, the MPS daemons and the GPU sampler write here from their own threads; the
``nodes`` / ``partitions`` views and ``/metrics`` read it. Per GPU (by global GPU id):

* ``refused``: why gpufence will not place work on it (e.g. its MIG mode does not match its
  partition); ``mig_status``: a re-partition under way; ``mig_error`` / ``mig_failures``: the
  last failed re-partition and how many;
* ``mps``: the state of its MPS control daemon, ``mps_restarts``;
* ``foreign``: processes on it that belong to no job holding it (pid, user, command, action);
* ``utilization``: the last NVML sample (0..1).

Per partition: ``enforced`` (bool) and ``enforcement`` (a sentence saying what is and is not).
"""

from __future__ import annotations

import copy
import threading
from typing import Any


class GpuBoard:
    """Thread-safe notes per GPU and per partition (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gpus: dict[int, dict[str, Any]] = {}
        self._parts: dict[str, dict[str, Any]] = {}

    def set(self, gid: int, **fields: Any) -> None:
        """Set fields of a GPU's notes; a field given as None is removed."""
        with self._lock:
            notes = self._gpus.setdefault(gid, {})
            for k, v in fields.items():
                if v is None:
                    notes.pop(k, None)
                else:
                    notes[k] = v

    def bump(self, gid: int, key: str, by: int = 1) -> int:
        with self._lock:
            notes = self._gpus.setdefault(gid, {})
            notes[key] = int(notes.get(key, 0)) + by
            return int(notes[key])

    def gpu(self, gid: int) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._gpus.get(gid, {}))

    def gpus(self) -> dict[int, dict[str, Any]]:
        with self._lock:
            return copy.deepcopy(self._gpus)

    def set_partition(self, name: str, **fields: Any) -> None:
        with self._lock:
            self._parts.setdefault(name, {}).update(fields)

    def partition(self, name: str) -> dict[str, Any]:
        with self._lock:
            return dict(self._parts.get(name, {}))
