"""dcgm-exporter's HPC job-mapping files, kept current as jobs bind and release GPUs.

With ``control.telemetry.dcgm_job_mapping_dir`` set, gpufence keeps one file per GPU of this
machine in that directory, named by the GPU's NVML index, holding the ids of the jobs on it,
one per line (empty when it is free), and one file ``<index>.<GPU instance id>`` per MIG
instance the GPU sampler has seen, with the job on that instance — the format dcgm-exporter
reads with ``--hpc-job-mapping-dir`` (or ``DCGM_HPC_JOB_MAPPING_DIR``) to label its series
``hpc_job``. A MIG job is also listed in its parent GPU's file (the GPU-wide series). The GPU
instance id comes from NVML through the sampler (``gpus/gpu_counters.py``), so an instance's
file appears at the first sample after the instance is created; the file of an instance that
is gone is removed.

The format, as dcgm-exporter documents it (README of github.com/NVIDIA/dcgm-exporter, "Include
HPC Job Information in Metric Labels"; the ``dcgm-exporter`` command reference on
docs.nvidia.com): the file name is the GPU's id, or ``<GPU id>.<MIG id>`` for a MIG instance
("0", "1", "2.0"); the content is one job id per line; the directory is given with
``--hpc-job-mapping-dir`` / ``DCGM_HPC_JOB_MAPPING_DIR``. dcgm-exporter then adds the job id to
that GPU's series as its ``hpc_job`` label.

Updated after every reconciler cycle (on its thread, from the ledger); a file is rewritten only
when its jobs changed, atomically (a temporary file renamed over it), so dcgm-exporter never
reads half a file.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from gpufence.control.gpus.devices import DeviceError
from gpufence.state.ledger import HOLD_PREFIX

if TYPE_CHECKING:
    from gpufence.control.reconciler import Reconciler

log = logging.getLogger("gpufence.observe")


def _gi_ids(r: Reconciler) -> dict[str, tuple[int, int]]:
    """MIG device UUID -> (NVML index of its GPU, GPU instance id), from the sampler's board."""
    out: dict[str, tuple[int, int]] = {}
    if r.gpu_board is None:
        return out
    cluster = r.scheduler.cluster
    for gid, notes in r.gpu_board.gpus().items():
        for m in notes.get("mig_memory") or ():
            if m.get("gi_id") is not None:
                out[str(m["uuid"])] = (cluster.gpus[gid].index, int(m["gi_id"]))
    return out


def jobs_per_gpu(r: Reconciler) -> dict[str, list[str]]:
    """File name -> job ids: ``<index>`` for every GPU of this machine (node 0), and
    ``<index>.<GPU instance id>`` for every MIG instance with a known id."""
    cluster = r.scheduler.cluster
    gi_ids = _gi_ids(r)
    out: dict[str, list[str]] = {str(g.index): [] for g in cluster.gpus if g.node == 0}
    for index, gi in gi_ids.values():
        out.setdefault(f"{index}.{gi}", [])
    for jid, alloc in sorted(r.scheduler.ledger.allocs.items()):
        if jid.startswith(HOLD_PREFIX):
            continue
        for a in alloc.assignments:
            local = [gid for gid in sorted(set(a.gpus)) if cluster.gpus[gid].node == 0]
            for gid in local:
                files = out[str(cluster.gpus[gid].index)]
                if jid not in files:
                    files.append(jid)
            if a.mig_profile is None or not local:
                continue
            try:
                uuids = r.devices.devices(a)
            except DeviceError:
                continue
            for uuid in uuids:
                where = gi_ids.get(uuid)
                if where is not None:
                    out[f"{where[0]}.{where[1]}"].append(jid)
    return out


class DcgmJobMap:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._written: dict[str, list[str]] = {}
        self.dir.mkdir(parents=True, exist_ok=True)

    def update(self, r: Reconciler) -> None:
        want = jobs_per_gpu(r)
        for name in [n for n in self._written if n not in want]:  # a MIG instance gone
            try:
                (self.dir / name).unlink(missing_ok=True)
            except OSError as exc:
                log.warning("dcgm job mapping %s not removed: %s", name, exc)
                continue
            del self._written[name]
        for name, jobs in want.items():
            if self._written.get(name) == jobs:
                continue
            try:
                self._write(name, jobs)
            except OSError as exc:  # the next cycle tries again
                log.warning("dcgm job mapping for GPU %s not written: %s", name, exc)
                continue
            self._written[name] = jobs

    def _write(self, name: str, jobs: list[str]) -> None:
        path = self.dir / name
        tmp = self.dir / f".{name}.tmp{os.getpid()}"
        tmp.write_text("".join(f"{j}\n" for j in jobs), encoding="utf-8")
        tmp.chmod(0o644)  # dcgm-exporter runs as another user
        os.replace(tmp, path)
