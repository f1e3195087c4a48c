"""A read-only query surface for front ends (control-plane views, simulator timelines, tests):
plain frozen values computed from the scheduler's state, so no front end reaches into the
ledger's arrays or the queues' heaps, and none can change them by accident.

Every answer is a snapshot of the state between two steps; call again after the next step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from gpufence.model.job import WorkloadClass
from gpufence.model.partition import SharingMode
from gpufence.sched.cycle import SchedulerState
from gpufence.state.ledger import HOLD_PREFIX


@dataclass(frozen=True, slots=True)
class MigSlot:
    profile: str
    start: int
    job: str | None


@dataclass(frozen=True, slots=True)
class GpuUse:
    gid: int
    jobs: tuple[str, ...]  # who runs on it (exclusive holder, time-slice or fraction sharers)
    milli_used: int  # fractional shares in use
    usable: bool  # its node is up and it is not being re-partitioned
    mig: tuple[MigSlot, ...] | None  # its MIG instances (None: not in MIG mode)


@dataclass(frozen=True, slots=True)
class Holding:
    """What one running (or stopping) job holds."""

    job_id: str
    workload_class: WorkloadClass
    home: str
    pool: str  # the partition whose GPUs it occupies
    charge_milli: int
    gpus: int
    lent_from: str | None


@dataclass(frozen=True, slots=True)
class PoolUse:
    name: str
    used_milli: int
    free_whole_gpus: int  # GPUs nobody holds (0 in MIG partitions: instances, not GPUs)
    free_on_idle_nodes: int  # of those, the GPUs on nodes whose GPUs of this pool are all free
    lent_gpus: int
    largest_gang: int  # whole GPUs the largest single-node gang could get now


@dataclass(frozen=True, slots=True)
class PendingJob:
    job_id: str
    workload_class: WorkloadClass
    home: str
    queue: str


@dataclass(frozen=True, slots=True)
class ReservationView:
    job_id: str
    pool: str
    start: float  # inf: when running jobs end
    gpus: tuple[int, ...]


class SchedulerQuery:
    def __init__(self, state: SchedulerState) -> None:
        self._s = state

    def gpu(self, gid: int) -> GpuUse:
        led = self._s.core.ledger
        mig = led.mig.get(gid)
        if mig is not None:
            slots = tuple(
                MigSlot(inst.profile, inst.start, occ)
                for inst, occ in zip(mig.instances, mig.occupant, strict=True)
            )
            jobs = tuple(occ for occ in mig.occupant if occ is not None)
            return GpuUse(gid, jobs, led.milli[gid], led.gpu_usable(gid), slots)
        owner = led.owner[gid]
        found: list[str] = []
        if owner is not None and not owner.startswith(HOLD_PREFIX):
            found.append(owner)
        found += [j for j in led.ts[gid] if j not in found]
        found += [j for j in led.shares[gid] if j not in found]
        return GpuUse(gid, tuple(found), led.milli[gid], led.gpu_usable(gid), None)

    def node_up(self, node: int) -> bool:
        return self._s.core.ledger.node_up[node]

    def pool(self, name: str) -> PoolUse:
        core = self._s.core
        led, c = core.ledger, core.cluster
        mig = c.partitions[name].sharing is SharingMode.MIG
        idle_nodes = sum(
            len(c.node_partition_gpus[(name, n)])
            for n in c.partition_nodes[name]
            if led.free_count[(name, n)] == len(c.node_partition_gpus[(name, n)])
        )
        buckets = led.buckets.get(name, [])
        largest = next((k for k in range(len(buckets) - 1, 0, -1) if buckets[k]), 0)
        return PoolUse(
            name=name,
            used_milli=led.pool_used[name],
            free_whole_gpus=0 if mig else led.pool_free[name],
            free_on_idle_nodes=idle_nodes,
            lent_gpus=led.lent[name],
            largest_gang=largest,
        )

    def holdings(self) -> Iterator[Holding]:
        """Every allocation, in the order the jobs got them."""
        for jid, a in self._s.core.ledger.allocs.items():
            yield Holding(
                jid,
                a.job.workload_class,
                a.home,
                a.pool,
                a.charge_milli,
                a.job.total_gpus,
                a.lent_from,
            )

    def pending(self) -> Iterator[PendingJob]:
        """Every pending job, in arrival order (not scheduling order)."""
        for rec in self._s.core.queues.records.values():
            yield PendingJob(rec.job.id, rec.job.workload_class, rec.home, rec.queue)

    def reservation(self, partition: str) -> ReservationView | None:
        res = self._s.claims.reservations.get(partition)
        if res is None:
            return None
        return ReservationView(res.job_id, res.pool, res.start, res.gpus)

    def preemption_windows(self) -> dict[str, tuple[float, ...]]:
        """Per partition, when the incident preemptions still in its budget window were made
        (as of the last cycle): what a front end saves so a restart gives none of it back
        (``PreemptionsRestored``)."""
        now = self._s.core.now
        out: dict[str, tuple[float, ...]] = {}
        for p, times in self._s.protection.times.items():
            part = self._s.core.cluster.partitions.get(p)
            if part is None:
                continue
            kept = tuple(t for t in times if t > now - part.preemption.window_s)
            if kept:
                out[p] = kept
        return out

    def defrag_windows(self) -> dict[str, tuple[float, ...]]:
        """Per MIG pool with a defrag budget, when the MIG defrag stops still in its window were
        noticed (as of the last cycle): what a front end saves so a restart gives none of it
        back (``DefragsRestored``)."""
        now = self._s.core.now
        out: dict[str, tuple[float, ...]] = {}
        for p, times in self._s.mig.defrag.times.items():
            part = self._s.core.cluster.partitions.get(p)
            cfg = part.mig if part is not None else None
            if cfg is None or cfg.defrag_budget <= 0:
                continue
            kept = tuple(t for t in times if t > now - cfg.defrag_window_s)
            if kept:
                out[p] = kept
        return out
