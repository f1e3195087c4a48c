"""Contention: how fast each running job progresses, re-rated whenever its neighbours change.

A job's slowdown s ≥ 1 (its solo run time × s = its run time now) is the product of

* **time-slice neighbours**: s = 1 + (1 + ε)·Σ_j u_j over the other jobs sharing its GPU, busy
  co-runners u = 1, ε = 0.11 (research/contention.md §4.2-3; nebuly's inference measurement at
  N = 3..7 [V]; up to 0.23 for saturating kernels, Colfax [V2]);
* **the fabric**: a multi-GPU training gang's iteration time under ring all-reduce on the links
  of its placement, shared with the other gangs' traffic, over the same on an uncontended
  placement (``sim.fabric``; §4.3).

Both change while a job runs, so the simulator calls ``update`` after every step with the jobs
that started and ended; it returns the new slowdown of every running job it touched (the
neighbours on shared GPUs, the gangs on shared links) and the runner re-schedules their
completion — a job that starts alone and gets three busy time-slice neighbours after 100 s
of a 1,000 s run ends at 100 + 900 × 4.33 = 3,997 s, not at 1,000 s.

**Serving replicas** are scored per window (``sim.serving``): a request's service time is
stretched by its GPU's time-slice neighbours (mean factor, as above) and by gang bursts on the
uplinks its node and rack share. For the latter (§4.2-6 bimodal service time, §4.3 fair
share): a share ``network_share`` of a request's time moves data over the node's NIC / PCIe
path; while a gang burst holds the link — a fraction U of the time, the link's utilisation
from ``sim.fabric`` — that part runs at the fair share, half the link (max-min fairness
against one competing flow, §4.3; Colfax measured exact 1/k PCIe shares [V2]), so
s_busy = 1 + network_share; E[s] = 1 + U·network_share and the extra service variance
Var(s)/E[s]² = U(1 − U)·network_share²/E[s]² is added to c_s² (§4.2-6, §4.4-1). The share
itself has no published calibration (research/ §5 lists it nowhere) [I]: the default 0.25 is a
modelling choice, set per service.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpufence.model.cluster import Cluster
from gpufence.model.job import WorkloadClass
from gpufence.sim.fabric import Fabric
from gpufence.sim.workloads.records import CommSpec
from gpufence.state.ledger import Ledger

TIME_SLICE_EPS = 0.11  # §4.5 calibration table, nebuly [V]


@dataclass(frozen=True, slots=True)
class Exposure:
    """How a serving replica's requests are stretched."""

    mean_factor: float  # E[s]
    extra_cv2: float  # Var(s) / E[s]**2, added to the service c_s**2


@dataclass(frozen=True, slots=True)
class Released:
    """A job that left its GPUs this step."""

    job_id: str
    gpus: tuple[int, ...]
    time_sliced: bool


def burst_exposure(utilization: float, network_share: float) -> Exposure:
    """E[s] and the extra c_s² of a request whose link is busy a fraction ``utilization``."""
    u = min(max(utilization, 0.0), 1.0)
    f = max(network_share, 0.0)
    if u <= 0 or f <= 0:
        return Exposure(1.0, 0.0)
    mean = 1.0 + u * f
    return Exposure(mean, u * (1.0 - u) * f * f / (mean * mean))


class Contention:
    """Slowdowns of running jobs: time-slice neighbours × fabric, kept current by ``update``."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.fabric = Fabric(cluster)

    def timeslice_factor(self, ledger: Ledger, job_id: str) -> float:
        alloc = ledger.allocs.get(job_id)
        if alloc is None:
            return 1.0
        worst = 1.0
        for a in alloc.assignments:
            if not a.time_sliced:
                continue
            for g in a.gpus:
                others = sum(1 for j in ledger.ts[g] if j != job_id)
                worst = max(worst, 1.0 + (1.0 + TIME_SLICE_EPS) * others)
        return worst

    def factor(self, ledger: Ledger, job_id: str) -> float:
        return self.timeslice_factor(ledger, job_id) * self.fabric.factor(job_id)

    def update(
        self,
        ledger: Ledger,
        bound: Sequence[str],
        released: Iterable[Released],
        comm: dict[str, CommSpec],
    ) -> dict[str, float]:
        """After a step: ``bound`` jobs started, ``released`` ones left their GPUs; ``comm``
        holds the all-reduce of the bound gangs. Returns {running job: slowdown} for every job
        whose slowdown may have changed; a bound job left out runs at solo speed."""
        touched: set[str] = set()  # bound jobs with neither neighbours nor traffic: solo
        ts_gpus: set[int] = set()
        for r in released:
            if r.time_sliced:
                ts_gpus.update(r.gpus)
            touched |= self.fabric.remove(r.job_id)
        for jid in bound:
            alloc = ledger.allocs.get(jid)
            if alloc is None:
                continue
            for a in alloc.assignments:
                if a.time_sliced:
                    ts_gpus.update(a.gpus)
                    touched.add(jid)
            spec = comm.get(jid)
            if spec is not None and alloc.job.workload_class is not WorkloadClass.SERVING:
                touched |= self.fabric.add(alloc, spec)
        for g in ts_gpus:
            touched.update(ledger.ts[g])
        return {j: self.factor(ledger, j) for j in touched if j in ledger.allocs}

    def mean_replica_exposure(
        self, ledger: Ledger, job_ids: Sequence[str], network_share: float
    ) -> Exposure:
        """How the requests of a pool of serving replicas are stretched now, averaged over the
        replicas (requests spread evenly): time-slice neighbours × uplink bursts, the burst
        part computed once per node. Called every autoscaler window: kept lean."""
        if not job_ids:
            return Exposure(1.0, 0.0)
        fab = self.fabric
        load = fab.load
        nodes = self.cluster.nodes
        allocs = ledger.allocs
        per_node: dict[int, Exposure] = {}
        none = Exposure(1.0, 0.0)
        mean_sum = 0.0
        cv2_sum = 0.0
        for jid in job_ids:
            alloc = allocs.get(jid)
            if alloc is None:
                mean_sum += 1.0
                continue
            worst = none
            sliced = False
            for a in alloc.assignments:
                sliced = sliced or a.time_sliced
                if not load:
                    continue
                e = per_node.get(a.node)
                if e is None:
                    node_u = load.get(fab.node_link[a.node], 0.0)
                    rack = fab.rack_link[nodes[a.node].rack]
                    rack_u = load.get(rack, 0.0)
                    if node_u <= 0 and rack_u <= 0:
                        e = none
                    else:
                        u = max(fab.utilization(fab.node_link[a.node]), fab.utilization(rack))
                        e = burst_exposure(u, network_share)
                    per_node[a.node] = e
                if e.mean_factor > worst.mean_factor:
                    worst = e
            ts = self.timeslice_factor(ledger, jid) if sliced else 1.0
            mean_sum += worst.mean_factor * ts
            cv2_sum += worst.extra_cv2
        n = len(job_ids)
        return Exposure(mean_sum / n, cv2_sum / n)
