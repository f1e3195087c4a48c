"""Periodic samples of the simulated cluster: allocation, utilisation, fragmentation, links.

A Controller that wakes every ``every_s`` and reads the scheduler's ledger and the fabric model
(never changes them). Fragmentation and the largest placeable gang are ``telemetry.capacity``'s
definitions, read off each pool's free capacity per GPU (milli): exclusive and time-sliced
pools against a whole-node request, MIG and fractional pools against a whole GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufence.model.events import Event
from gpufence.model.job import WorkloadClass
from gpufence.model.partition import SharingMode
from gpufence.sim.fabric import Fabric
from gpufence.sim.runner import Simulation
from gpufence.state.freecap import pool_free_milli
from gpufence.telemetry.capacity import (
    largest_placeable_gang,
    pool_fragmentation,
    whole_gpu_pool,
)


@dataclass(slots=True)
class Sample:
    t: float
    allocated: dict[str, float]  # GPUs allocated per partition (pool)
    busy: dict[str, float]  # GPUs doing work (idle notebooks count 0)
    fragmentation: dict[str, float]
    largest_gang: dict[str, int]
    links: dict[str, float]  # utilisation of every link carrying traffic (absent = 0)
    pending: dict[str, int]  # per class
    running: dict[str, int]
    oldest_wait_s: dict[str, float]  # per class: how long the longest-waiting job has waited
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
    _pools: dict[str, tuple[int, float, int]] = field(default_factory=dict)  # version, frag, gang

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
        classes = [str(w) for w in WorkloadClass]
        pending = dict.fromkeys(classes, 0)
        running = dict(pending)
        oldest = dict.fromkeys(classes, 0.0)
        for h in query.holdings():
            running[str(h.workload_class)] += 1
            if h.workload_class is WorkloadClass.INTERACTIVE:
                act = _current_activity(sim, h.job_id, now)
                busy[h.pool] -= h.charge_milli / 1000.0 * (1.0 - act)
        for job in query.pending():
            cls = str(job.workload_class)
            pending[cls] += 1
            tr = sim.jobs.get(job.job_id)
            if tr is not None and tr.first_start is None:
                oldest[cls] = max(oldest[cls], now - tr.submitted)
        # fragmentation: the telemetry definitions read free capacity per node / GPU off the
        # ledger (read-only), recomputed only for pools whose nodes changed
        led = sim.scheduler.ledger
        frag: dict[str, float] = {}
        gang: dict[str, int] = {}
        for p, part in c.partitions.items():
            cached = self._pools.get(p)
            if cached is not None and cached[0] == led.pool_version[p]:
                frag[p], gang[p] = cached[1], cached[2]  # nothing changed on its nodes
                continue
            if part.sharing in (SharingMode.EXCLUSIVE, SharingMode.TIME_SLICE):
                nodes = c.partition_nodes[p]
                frag[p], gang[p] = whole_gpu_pool(
                    [led.free_count[(p, n)] for n in nodes],
                    [len(c.node_partition_gpus[(p, n)]) for n in nodes],
                )
            else:
                free = pool_free_milli(led, c, p)
                frag[p] = pool_fragmentation(free, str(part.sharing))
                mig = part.sharing is SharingMode.MIG
                gang[p] = largest_placeable_gang(free) if not mig else 0
            self._pools[p] = (led.pool_version[p], frag[p], gang[p])
        # checkpoint writes since the last sample load the shared storage: each write moves
        # checkpoint_gb_per_gpu x GPUs of the job (sharded model + optimizer state) [I]
        new = sim.checkpoints[self._seen_ckpt :]
        self._seen_ckpt = len(sim.checkpoints)
        gbits = sum(g for _, g in new) * self.checkpoint_gb_per_gpu * 8.0
        storage = min(1.0, gbits / (self.every_s * self.storage_gbps)) if new else 0.0
        links = self.fabric.utilizations()
        return Sample(now, allocated, busy, frag, gang, links, pending, running, oldest, storage)


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
