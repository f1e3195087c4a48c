"""The job ``device_check.py`` runs on a GPU: what CUDA lets this process see and allocate.

Standard library only: it talks to the CUDA driver through ``ctypes`` on ``libcuda.so.1``, which
every NVIDIA driver installs (no CUDA toolkit, no cuda-python). It initialises CUDA, counts the
devices it sees, reads device 0's UUID, makes the primary context current and allocates each
``--alloc-mib`` in turn with ``cuMemAlloc`` (plain device memory, never managed memory), keeping
them, then sleeps ``--hold-s`` seconds so the process is on the GPU while it is looked at.

Prints one JSON line first thing after the allocations::

    {"pid": ..., "cuda": true, "devices": 1, "uuid": "GPU-...", "allocs": [{"mib": 256,
     "ok": true, "code": 0}, ...], "env": {"CUDA_VISIBLE_DEVICES": ..., ...}}

Without a driver (the no-GPU self-check) ``cuda`` is false and ``error`` says why.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from typing import Any

CUDA_SUCCESS = 0


def _uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def probe(allocs: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "pid": os.getpid(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("CUDA_")},
    }
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return {**out, "cuda": False, "error": f"libcuda.so.1: {exc}"}
    rc = cuda.cuInit(0)
    if rc != CUDA_SUCCESS:
        return {**out, "cuda": False, "error": f"cuInit: CUDA error {rc}"}
    count = ctypes.c_int(0)
    cuda.cuDeviceGetCount(ctypes.byref(count))
    out.update(cuda=True, devices=count.value, allocs=[])
    if count.value < 1:
        return out
    dev = ctypes.c_int(0)
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    raw = ctypes.create_string_buffer(16)
    get_uuid = getattr(cuda, "cuDeviceGetUuid_v2", None) or cuda.cuDeviceGetUuid
    if get_uuid(raw, dev) == CUDA_SUCCESS:
        out["uuid"] = _uuid(raw.raw)
    ctx = ctypes.c_void_p()
    rc = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    if rc != CUDA_SUCCESS or cuda.cuCtxSetCurrent(ctx) != CUDA_SUCCESS:
        out["error"] = f"no context: CUDA error {rc}"
        return out
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    for mib in allocs:
        ptr = ctypes.c_uint64(0)
        rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib << 20))
        out["allocs"].append({"mib": mib, "ok": rc == CUDA_SUCCESS, "code": rc})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--alloc-mib", type=int, action="append", default=[])
    ap.add_argument("--hold-s", type=float, default=0.0)
    args = ap.parse_args()
    print(json.dumps(probe(args.alloc_mib)), flush=True)
    time.sleep(args.hold_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
