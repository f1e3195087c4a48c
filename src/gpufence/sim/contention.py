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
from gpufence.sim.fabric import CommSpec, Fabric
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
        whose slowdown may have changed (the bound ones always)."""
        touched: set[str] = set(bound)
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
            spec = comm.get(jid)
            if spec is not None and alloc.job.workload_class is not WorkloadClass.SERVING:
                touched |= self.fabric.add(alloc, spec)
        for g in ts_gpus:
            touched.update(ledger.ts[g])
        return {j: self.factor(ledger, j) for j in touched if j in ledger.allocs}

    def replica_exposure(self, ledger: Ledger, job_id: str, network_share: float) -> Exposure:
        """Stretch of a serving replica's requests now: time-slice neighbours × uplink bursts."""
        alloc = ledger.allocs.get(job_id)
        if alloc is None:
            return Exposure(1.0, 0.0)
        fab = self.fabric
        worst = Exposure(1.0, 0.0)
        if fab.load:
            for a in alloc.assignments:
                node = self.cluster.nodes[a.node]
                u = max(
                    fab.utilization(fab.node_link[a.node]),
                    fab.utilization(fab.rack_link[node.rack]),
                )
                if u > 0:
                    e = burst_exposure(u, network_share)
                    if e.mean_factor > worst.mean_factor:
                        worst = e
        ts = self.timeslice_factor(ledger, job_id)
        if ts == 1.0:
            return worst
        return Exposure(worst.mean_factor * ts, worst.extra_cv2)
