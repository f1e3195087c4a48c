"""dcgm-exporter's HPC job-mapping files, kept current as jobs bind and release GPUs.

With ``control.telemetry.dcgm_job_mapping_dir`` set, gpufence keeps one file per GPU of this
machine in that directory, named by the GPU's NVML index, holding the ids of the jobs on it,
one per line (empty when it is free) — the format dcgm-exporter reads with
``--hpc-job-mapping-dir`` (or ``DCGM_HPC_JOB_MAPPING_DIR``) to label its series ``hpc_job``.
A MIG instance's job is listed in its parent GPU's file: dcgm-exporter names MIG files
``<gpu>.<GPU instance id>`` and gpufence does not track NVML's GPU instance ids.

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

from gpufence.state.ledger import HOLD_PREFIX

if TYPE_CHECKING:
    from gpufence.control.reconciler import Reconciler

log = logging.getLogger("gpufence.observe")


def jobs_per_gpu(r: Reconciler) -> dict[int, list[str]]:
    """NVML index -> job ids holding it, for every GPU of this machine (node 0)."""
    cluster = r.scheduler.cluster
    out: dict[int, list[str]] = {g.index: [] for g in cluster.gpus if g.node == 0}
    for jid, alloc in sorted(r.scheduler.ledger.allocs.items()):
        if jid.startswith(HOLD_PREFIX):
            continue
        for gid in sorted(set(alloc.gpu_ids())):
            g = cluster.gpus[gid]
            if g.node == 0:
                out[g.index].append(jid)
    return out


class DcgmJobMap:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._written: dict[int, list[str]] = {}
        self.dir.mkdir(parents=True, exist_ok=True)

    def update(self, r: Reconciler) -> None:
        for index, jobs in jobs_per_gpu(r).items():
            if self._written.get(index) == jobs:
                continue
            try:
                self._write(index, jobs)
            except OSError as exc:  # the next cycle tries again
                log.warning("dcgm job mapping for GPU %d not written: %s", index, exc)
                continue
            self._written[index] = jobs

    def _write(self, index: int, jobs: list[str]) -> None:
        path = self.dir / str(index)
        tmp = self.dir / f".{index}.tmp{os.getpid()}"
        tmp.write_text("".join(f"{j}\n" for j in jobs), encoding="utf-8")
        tmp.chmod(0o644)  # dcgm-exporter runs as another user
        os.replace(tmp, path)
