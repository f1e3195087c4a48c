"""Fabric model: ring all-reduce of each running gang over NVLink, node uplinks and rack uplinks.

Cost of one iteration of a data-parallel gang of n ranks (α–β model, research/contention.md
§4.3): a compute phase of ``compute_s`` then a ring all-reduce of its gradients, S bytes:

    T_comm = 2(n−1)/n · S / B + 2(n−1)·α

(2(n−1) ring steps, each sending S/n to the next rank; the NVSwitch explainer cited in §4.3
[V2]). A ring laid out node by node (and rack by rack) sends D = 2(n−1)/n · S bytes through
every edge it crosses: each GPU's NVLink (when the node holds ≥ 2 of its ranks), each node
uplink (when the gang spans ≥ 2 nodes: the ring leaves and re-enters every node once; NCCL's
parallel rings over several NICs split D, they do not multiply it) and each rack uplink (when
it spans ≥ 2 racks). B is the slowest of those links as the gang sees it:

* with no other traffic, the link's bandwidth per direction — a gang's own traffic is not
  contention with itself;
* sharing a link with other gangs, what they leave: B·(1 − U_others), U_others = Σ D_h / (B ·
  t_iter_h) their time-averaged load, but never less than the max-min fair share B/(k+1) when
  k others burst at once (§4.3: "each of k concurrently-communicating jobs gets B/k").

A gang's slowdown is its iteration time over its iteration time on the same placement with no
contention and no rack bottleneck (NVLink and node uplinks only): a gang whose ring crosses an
oversubscribed rack uplink is slower even alone — that is the placement, not contention.
Loads and iteration times depend on each other; ``add``/``remove`` re-solve the gangs whose
links changed until no iteration time moves by more than 0.1 % (a few passes).

Link bandwidths: NVLink = the GPU type's ``nvlink_gbps`` / 2 per direction (the catalogue's
figure is the bidirectional total, e.g. H100 900 GB/s), PCIe Gen4 x16 (32 GB/s per direction
[R]) for GPUs without NVLink; node and rack uplinks = the cluster's ``fabric`` (Gbit/s per
direction). α per ring step: 5 µs over NVLink, 15 µs over the network [I: NCCL's small-message
latency on NVLink and InfiniBand is of that order; no source in research/].
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpufence.model.cluster import Cluster
from gpufence.sim.workloads.records import CommSpec
from gpufence.state.ledger import Allocation

PCIE_GBPS = 256.0  # PCIe Gen4 x16 per direction, Gbit/s [R]
ALPHA_NVLINK_S = 5e-6  # [I]
ALPHA_NET_S = 15e-6  # [I]
CONVERGED = 1e-3  # relative change of an iteration time that ends the re-solve
MAX_PASSES = 8


@dataclass(slots=True)
class Gang:
    job_id: str
    ranks: int
    bytes_per_iter: float  # D through each link it crosses
    compute_s: float
    alpha_s: float  # 2(n−1)·α
    nvlink: tuple[tuple[str, int], ...]  # (link, ranks on that node) for nodes with >= 2 ranks
    shared: tuple[str, ...]  # node and rack uplinks its ring crosses
    ref_s: float  # iteration time alone, NVLink and node uplinks only
    iter_s: float = 0.0

    @property
    def factor(self) -> float:
        return self.iter_s / self.ref_s if self.ref_s > 0 else 1.0


@dataclass
class Fabric:
    """Live link loads of the running gangs (bytes/s per link, time-averaged)."""

    cluster: Cluster
    gangs: dict[str, Gang] = field(default_factory=dict)
    load: dict[str, float] = field(default_factory=dict)  # bytes/s
    on_link: dict[str, dict[str, None]] = field(default_factory=dict)  # shared link -> gangs

    def __post_init__(self) -> None:
        c = self.cluster
        self.bandwidth: dict[str, float] = {}
        self.link_class: dict[str, str] = {}
        for n in c.nodes:
            gt = c.gpu_types[n.gpu_type]
            nv = gt.nvlink_gbps / 2.0 if gt.nvlink_gbps > 0 else PCIE_GBPS
            self._link(f"nvlink:{n.name}", "nvlink", nv * len(n.gpu_ids))
            self._link(f"node:{n.name}", "node_uplink", c.fabric.node_uplink_gbps)
        for r in c.racks:
            self._link(f"rack:{r}", "rack_uplink", c.fabric.rack_uplink_gbps)
        self.node_link = [f"node:{n.name}" for n in c.nodes]
        self.rack_link = {r: f"rack:{r}" for r in c.racks}
        self._nvlink_per_gpu = [
            self.bandwidth[f"nvlink:{n.name}"] / max(len(n.gpu_ids), 1) for n in c.nodes
        ]
        self._nvlink_node = {f"nvlink:{n.name}": n.idx for n in c.nodes}

    def _link(self, name: str, cls: str, gbps: float) -> None:
        self.bandwidth[name] = gbps * 1e9 / 8.0  # bytes/s
        self.link_class[name] = cls

    def links_per_class(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for cls in self.link_class.values():
            out[cls] = out.get(cls, 0) + 1
        return out

    # ------------------------------------------------------------------ changes
    def add(self, alloc: Allocation, spec: CommSpec) -> set[str]:
        """A gang started: place its traffic; returns the gangs whose iteration time changed
        (itself included)."""
        g = self._gang(alloc, spec)
        if g is None:
            return set()
        self.gangs[g.job_id] = g
        for link, ranks in g.nvlink:
            self._load(link, ranks * g.bytes_per_iter / g.iter_s)
        for link in g.shared:
            self.on_link.setdefault(link, {})[g.job_id] = None
            self._load(link, g.bytes_per_iter / g.iter_s)
        if not g.shared:  # NVLink only: nothing to share, nothing to re-solve
            return {g.job_id}
        return self._solve({g.job_id} | self._neighbours(g)) | {g.job_id}

    def remove(self, job_id: str) -> set[str]:
        """A gang ended: take its traffic off; returns the gangs whose iteration time changed."""
        g = self.gangs.pop(job_id, None)
        if g is None:
            return set()
        for link, ranks in g.nvlink:
            self._load(link, -ranks * g.bytes_per_iter / g.iter_s)
        for link in g.shared:
            self._load(link, -g.bytes_per_iter / g.iter_s)
            users = self.on_link.get(link)
            if users is not None:
                users.pop(job_id, None)
                if not users:
                    del self.on_link[link]
        return self._solve(self._neighbours(g)) if g.shared else set()

    def factor(self, job_id: str) -> float:
        g = self.gangs.get(job_id)
        return g.factor if g is not None else 1.0

    def utilization(self, link: str) -> float:
        return min(1.0, self.load.get(link, 0.0) / self.bandwidth[link])

    def utilizations(self) -> dict[str, float]:
        """Every link that carries traffic now, with its utilisation (0..1)."""
        return {link: self.utilization(link) for link, v in self.load.items() if v > 0}

    def gangs_on(self, link: str) -> int:
        return len(self.on_link.get(link, ()))

    # ------------------------------------------------------------------ model
    def _gang(self, alloc: Allocation, spec: CommSpec) -> Gang | None:
        per_node: dict[int, int] = {}
        for a in alloc.assignments:
            per_node[a.node] = per_node.get(a.node, 0) + len(a.gpus)
        n = sum(per_node.values())
        if n < 2 or spec.allreduce_gb <= 0:
            return None
        nodes = self.cluster.nodes
        racks = {nodes[i].rack for i in per_node}
        d = 2.0 * (n - 1) / n * spec.allreduce_gb * 1e9
        nvlink = tuple(
            (f"nvlink:{nodes[i].name}", k) for i, k in sorted(per_node.items()) if k >= 2
        )
        shared: tuple[str, ...] = ()
        if len(per_node) >= 2:
            shared = tuple(self.node_link[i] for i in sorted(per_node))
            if len(racks) >= 2:
                shared += tuple(self.rack_link[r] for r in sorted(racks))
        alpha = 2 * (n - 1) * (ALPHA_NET_S if len(per_node) >= 2 else ALPHA_NVLINK_S)
        ref_bw = [self._nvlink_per_gpu[i] for i, k in per_node.items() if k >= 2]
        ref_bw += [self.bandwidth[self.node_link[i]] for i in per_node if len(per_node) >= 2]
        ref = spec.compute_s + alpha + (d / min(ref_bw) if ref_bw else 0.0)
        g = Gang(alloc.job.id, n, d, spec.compute_s, alpha, nvlink, shared, ref)
        g.iter_s = self._iteration(g)
        return g

    def _iteration(self, g: Gang) -> float:
        """Iteration time of ``g`` given the other gangs' current loads on its links."""
        bw = min((self._nvlink_per_gpu_of(link) for link, _ in g.nvlink), default=float("inf"))
        mine = g.bytes_per_iter / g.iter_s if g.iter_s > 0 else 0.0
        for link in g.shared:
            cap = self.bandwidth[link]
            others = max(0.0, self.load.get(link, 0.0) - (mine if g.iter_s > 0 else 0.0))
            k = self.gangs_on(link) - (1 if g.job_id in self.on_link.get(link, ()) else 0)
            share = max(1.0 - others / cap, 1.0 / (k + 1)) if k > 0 else 1.0
            bw = min(bw, cap * share)
        comm = g.bytes_per_iter / bw if bw != float("inf") else 0.0
        return g.compute_s + g.alpha_s + comm

    def _nvlink_per_gpu_of(self, link: str) -> float:
        return self._nvlink_per_gpu[self._nvlink_node[link]]

    def _load(self, link: str, delta: float) -> None:
        v = self.load.get(link, 0.0) + delta
        if v <= self.bandwidth[link] * 1e-12:
            self.load.pop(link, None)
        else:
            self.load[link] = v

    def _neighbours(self, g: Gang) -> set[str]:
        out: set[str] = set()
        for link in g.shared:
            out.update(self.on_link.get(link, ()))
        out.discard(g.job_id)
        return out

    def _solve(self, start: Iterable[str]) -> set[str]:
        """Re-solve iteration times from ``start`` outwards until they settle."""
        changed: set[str] = set()
        todo = {j for j in start if j in self.gangs}
        for _ in range(MAX_PASSES):
            if not todo:
                break
            moved: set[str] = set()
            for jid in sorted(todo):
                g = self.gangs[jid]
                new = self._iteration(g)
                if abs(new - g.iter_s) > CONVERGED * g.iter_s:
                    old = g.iter_s
                    for link in g.shared:
                        self._load(link, g.bytes_per_iter / new - g.bytes_per_iter / old)
                    for link, ranks in g.nvlink:
                        self._load(link, ranks * (g.bytes_per_iter / new - g.bytes_per_iter / old))
                    g.iter_s = new
                    moved.add(jid)
            changed |= moved
            todo = (
                set().union(*(self._neighbours(self.gangs[j]) for j in moved)) if moved else set()
            )
        return changed
