"""Contention models: time-slice neighbours and fabric load from gang all-reduce traffic.

Calibration (research/contention.md §4.2, §4.3, §4.5):
  * Time-slicing: s_i = 1 + (1 + eps) * sum_j u_j over co-located jobs, eps = 0.11 (nebuly,
    inference, N = 3..7; up to 0.23 for saturating kernels, Colfax). Busy co-runners: u = 1.
  * Network: a gang's all-reduce loads the node uplinks it uses and, when it spans racks, the
    rack uplinks between its parts. Unmanaged contention costs ~10 % iteration time for a typical
    pair (Crux, +11 %) and up to 1.6x average JCT in bad mixes (CASSINI). We model the stretch
    of work crossing a link at utilisation U as 1 + 0.6 * U**2 (1.6x at a saturated link) [I].
  * Serving replicas that share a node uplink (same NIC / PCIe path) or a rack uplink with gang
    traffic are hit by the all-reduce *bursts*: while a burst runs (a fraction ``comm_duty`` of the
    time) a request is stretched by 1 + 1.5 * U**2 (2.5x at saturation, CASSINI's tail bound).
    That makes service time bimodal; §4.2-6 turns it into a mean factor E[s] and extra service
    variance Var(s)/E[s]**2 that the latency model adds to c_s**2, so the p99 leaves the SLO long
    before the GPUs look busy: the seed's "serving misses its SLO with free GPUs while the
    fabric runs a 64-GPU all-reduce".
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Assignment, Bind
from gpufence.model.job import Job, WorkloadClass
from gpufence.state.ledger import Ledger

TIME_SLICE_EPS = 0.11
LINK_STRETCH = 0.6  # extra time at a saturated link (CASSINI's 1.6x average bound)
BURST_STRETCH = 1.5  # extra time for a request caught in a burst (CASSINI's 2.5x tail bound)


def link_stretch(utilization: float) -> float:
    u = min(max(utilization, 0.0), 1.0)
    return 1.0 + LINK_STRETCH * u * u


def _racks_of(cluster: Cluster, assignments: tuple[Assignment, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in assignments:
        rack = cluster.nodes[a.node].rack
        out[rack] = out.get(rack, 0) + len(a.gpus)
    return out


@dataclass(frozen=True, slots=True)
class Exposure:
    """How a serving replica's requests are stretched by gang traffic on its links."""

    mean_factor: float  # E[s]
    extra_cv2: float  # Var(s) / E[s]**2, added to the service c_s**2


class Fabric:
    """Uplink load from the gangs running now, recomputed from the ledger on demand."""

    def __init__(self, cluster: Cluster, comm_gbps_per_gpu: float, comm_duty: float = 0.3) -> None:
        self.cluster = cluster
        self.comm_gbps_per_gpu = comm_gbps_per_gpu
        self.comm_duty = comm_duty

    def node_load_gbps(self, ledger: Ledger) -> dict[int, float]:
        """Gang traffic through each node's uplink (multi-node gangs only)."""
        load: dict[int, float] = {}
        for alloc in ledger.allocs.values():
            if alloc.job.workload_class is WorkloadClass.SERVING or len(alloc.assignments) < 2:
                continue
            nodes = {a.node for a in alloc.assignments}
            if len(nodes) < 2:
                continue
            for a in alloc.assignments:
                load[a.node] = load.get(a.node, 0.0) + self.comm_gbps_per_gpu * len(a.gpus)
        return load

    def exposure(self, node_util: float, rack_util: float) -> Exposure:
        u = self.comm_duty
        worst = max(min(node_util, 1.0), min(rack_util, 1.0))
        if worst <= 0 or u <= 0:
            return Exposure(1.0, 0.0)
        busy = 1.0 + BURST_STRETCH * worst * worst
        mean = 1.0 + u * (busy - 1.0)
        return Exposure(mean, u * (1.0 - u) * (busy - 1.0) ** 2 / mean**2)

    def rack_load_gbps(self, ledger: Ledger) -> dict[str, float]:
        load = dict.fromkeys(self.cluster.racks, 0.0)
        for alloc in ledger.allocs.values():
            if alloc.job.workload_class is WorkloadClass.SERVING or len(alloc.assignments) < 2:
                continue
            racks = _racks_of(self.cluster, alloc.assignments)
            if len(racks) < 2:
                continue
            total = sum(racks.values())
            for rack, n in racks.items():
                # traffic crossing this rack's uplink: its share of the ring, bisection-bounded
                load[rack] += self.comm_gbps_per_gpu * min(n, total - n)
        return load

    def rack_utilization(self, ledger: Ledger) -> dict[str, float]:
        cap = self.cluster.fabric.rack_uplink_gbps
        return {r: min(1.0, v / cap) for r, v in self.rack_load_gbps(ledger).items()}


class Contention:
    """Slowdown of a job at the moment it is bound (held for that attempt)."""

    def __init__(
        self, cluster: Cluster, comm_gbps_per_gpu: float = 25.0, comm_duty: float = 0.3
    ) -> None:
        self.cluster = cluster
        self.fabric = Fabric(cluster, comm_gbps_per_gpu, comm_duty)

    def _timeslice(self, ledger: Ledger, job: Job, assignments: tuple[Assignment, ...]) -> float:
        worst = 1.0
        for a in assignments:
            if not a.time_sliced:
                continue
            for g in a.gpus:
                others = sum(1 for j in ledger.ts[g] if j != job.id)
                worst = max(worst, 1.0 + (1.0 + TIME_SLICE_EPS) * others)
        return worst

    def job_factor(self, ledger: Ledger, job: Job, assignments: tuple[Assignment, ...]) -> float:
        f = self._timeslice(ledger, job, assignments)
        racks = _racks_of(self.cluster, assignments)
        if len(racks) > 1:
            util = self.fabric.rack_utilization(ledger)
            f *= max(link_stretch(util[r]) for r in racks)
        return f

    def replica_exposure(
        self, ledger: Ledger, job_id: str, rack_util: dict[str, float], node_load: dict[int, float]
    ) -> Exposure:
        alloc = ledger.allocs.get(job_id)
        if alloc is None:
            return Exposure(1.0, 0.0)
        ts = self._timeslice(ledger, alloc.job, alloc.assignments)
        cap = self.cluster.fabric.node_uplink_gbps
        worst = Exposure(1.0, 0.0)
        for a in alloc.assignments:
            rack = self.cluster.nodes[a.node].rack
            node_u = node_load.get(a.node, 0.0) / cap
            rack_u = rack_util.get(rack, 0.0)
            if node_u <= 0 and rack_u <= 0:
                continue  # the common case in a fence: nothing shares its links
            e = self.fabric.exposure(node_u, rack_u)
            if e.mean_factor > worst.mean_factor:
                worst = e
        if ts == 1.0:
            return worst
        return Exposure(worst.mean_factor * ts, worst.extra_cv2)

    # Slowdown protocol for the simulator
    def factor(self, bind: Bind, sim: object) -> float:
        ledger: Ledger = sim.scheduler.ledger  # type: ignore[attr-defined]
        alloc = ledger.allocs.get(bind.job_id)
        if alloc is None:
            return 1.0
        return self.job_factor(ledger, alloc.job, bind.assignments)
