"""Periodic samples of the simulated cluster: allocation, utilisation, fragmentation, fabric.

A Controller that wakes every ``every_s`` and reads the scheduler's ledger (never changes it).
Fragmentation of a partition = free GPUs that sit on partly used nodes, as a share of the
partition's GPUs: capacity that is idle yet unusable by a whole-node (8-GPU) gang.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufence.model.events import Event
from gpufence.model.job import WorkloadClass
from gpufence.model.partition import SharingMode
from gpufence.sim.contention import Fabric
from gpufence.sim.runner import Simulation


@dataclass(slots=True)
class Sample:
    t: float
    allocated: dict[str, float]  # GPUs allocated per partition (pool)
    busy: dict[str, float]  # GPUs doing work (idle notebooks count 0)
    fragmentation: dict[str, float]
    rack_util: dict[str, float]
    pending: dict[str, int]  # per class
    running: dict[str, int]
    storage_util: float = 0.0  # checkpoint write bandwidth / storage bandwidth, this interval


@dataclass
class Timeline:
    every_s: float
    horizon_s: float
    fabric: Fabric
    storage_gbps: float = 400.0
    checkpoint_gb_per_gpu: float = 10.0
    samples: list[Sample] = field(default_factory=list)
    _seen_ckpt: int = 0

    def first_wake(self) -> float | None:
        return 0.0

    def wake(self, now: float, sim: Simulation) -> tuple[list[Event], float | None]:
        self.samples.append(self.sample(now, sim))
        nxt = now + self.every_s
        return [], (nxt if nxt <= self.horizon_s else None)

    def sample(self, now: float, sim: Simulation) -> Sample:
        query = sim.scheduler.query
        c = sim.scheduler.cluster
        pools = {p: query.pool(p) for p in c.partitions}
        allocated = {p: use.used_milli / 1000.0 for p, use in pools.items()}
        busy = dict(allocated)
        pending = dict.fromkeys((str(w) for w in WorkloadClass), 0)
        running = dict(pending)
        for h in query.holdings():
            running[str(h.workload_class)] += 1
            if h.workload_class is WorkloadClass.INTERACTIVE:
                act = _current_activity(sim, h.job_id, now)
                busy[h.pool] -= h.charge_milli / 1000.0 * (1.0 - act)
        frag: dict[str, float] = {}
        for p, part in c.partitions.items():
            if part.sharing is SharingMode.MIG:
                frag[p] = 0.0
                continue
            use = pools[p]
            frag[p] = (use.free_whole_gpus - use.free_on_idle_nodes) / max(
                len(c.partition_gpus[p]), 1
            )
        for job in query.pending():
            pending[str(job.workload_class)] += 1
        # checkpoint writes since the last sample load the shared storage: each write moves
        # checkpoint_gb_per_gpu x GPUs of the job (sharded model + optimizer state) [I]
        new = sim.checkpoints[self._seen_ckpt :]
        self._seen_ckpt = len(sim.checkpoints)
        gbits = sum(g for _, g in new) * self.checkpoint_gb_per_gpu * 8.0
        storage = min(1.0, gbits / (self.every_s * self.storage_gbps)) if new else 0.0
        util = self.fabric.rack_utilization(sim.scheduler.ledger)  # the fabric model's input
        return Sample(now, allocated, busy, frag, util, pending, running, storage)


def _current_activity(sim: Simulation, job_id: str, now: float) -> float:
    tr = sim.jobs.get(job_id)
    if tr is None or tr.started is None:
        return 1.0
    since = now - tr.started
    level = 1.0
    for offset, util in tr.item.activity:
        if offset <= since:
            level = util
    return level
