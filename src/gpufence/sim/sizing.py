"""``gpufence size``: the smallest serving fence that keeps p99 within the SLO at peak with K
node failures, and what that fence costs training.

1. Peak demand: the highest request rate of each service over the scenario's horizon.
2. Replicas: the fewest that keep the Erlang-C p99 within the SLO at that peak (sim.latency).
3. Failure margin: K nodes' worth of replicas on top, rounded up to whole nodes: the fence.
4. Cost: the scenario is simulated (fenced policy) with that fence and with one node less,
   nodes moving between the serving and training partitions; the training queue delay and JCT
   deltas are what the last node of the fence costs, and the smaller fence's SLO attainment
   shows what it buys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from gpufence.model.cluster import Cluster
from gpufence.model.job import WorkloadClass
from gpufence.sim.experiment import rate_function, run_policy
from gpufence.sim.generate import generate
from gpufence.sim.latency import replicas_for_slo
from gpufence.sim.scenario import Scenario


@dataclass(frozen=True)
class SizeAnswer:
    serving_partition: str
    training_partition: str
    peak_rps: float
    replicas_at_peak: int
    margin_replicas: int
    fence_nodes: int
    fence_gpus: int
    current_nodes: int
    with_fence: dict[str, Any]
    one_node_less: dict[str, Any] | None
    explanation: list[str]


def _partition_with(cluster: Cluster, cls: WorkloadClass, exclude: str = "") -> str:
    for p, part in cluster.partitions.items():
        if cls in part.admits and p != exclude:
            return p
    raise ValueError(f"the cluster has no partition admitting {cls}")


def resize(cluster: Cluster, serving: str, training: str, nodes: int) -> Cluster:
    """Move whole nodes between ``serving`` and ``training`` so serving holds ``nodes`` nodes.
    Nodes join from the racks serving already uses first (keeping the fabric fence), and
    training queues' quotas scale with the capacity they keep."""
    s_nodes = list(cluster.partition_nodes[serving])
    t_nodes = list(cluster.partition_nodes[training])
    if nodes > len(s_nodes):
        racks = {cluster.nodes[n].rack for n in s_nodes}
        t_nodes.sort(key=lambda n: (cluster.nodes[n].rack not in racks, -n))
        s_nodes += t_nodes[: nodes - len(s_nodes)]
    else:
        s_nodes = s_nodes[:nodes]
    owner = {n: serving for n in s_nodes}
    moved = set(cluster.partition_nodes[serving]) | set(cluster.partition_nodes[training])
    gpus = tuple(
        replace(g, partition=owner.get(g.node, training)) if g.node in moved else g
        for g in cluster.gpus
    )
    old_cap = len(cluster.partition_gpus[training])
    new_cap = sum(1 for g in gpus if g.partition == training)
    queues = {}
    for name, q in cluster.queues.items():
        if q.partition == training and q.nominal_milli is not None and old_cap:
            q = replace(q, nominal_milli=q.nominal_milli * new_cap // old_cap)
        queues[name] = q
    return replace(cluster, gpus=gpus, queues=queues)


def size_fence(
    sc: Scenario, cluster: Cluster, slo_p99_ms: float, failure_margin: int = 1
) -> SizeAnswer:
    if not sc.services:
        raise ValueError("the scenario has no services to size a fence for")
    serving = _partition_with(cluster, WorkloadClass.SERVING)
    training = _partition_with(cluster, WorkloadClass.TRAINING, exclude=serving)
    per_node = min(
        len(cluster.node_partition_gpus[(serving, n)]) for n in cluster.partition_nodes[serving]
    )
    peak_total = 0.0
    replicas = 0
    gpus_needed = 0
    margin_gpus = 0
    for i, svc in enumerate(sc.services):
        rate = rate_function(sc, i)
        peak = max(rate(t) for t in range(0, int(sc.horizon_s) + 1, 60))
        peak_total += peak
        r = replicas_for_slo(peak, svc.service_ms / 1000.0, slo_p99_ms / 1000.0, svc.service_cv)
        if r is None:
            raise ValueError(
                f"services[{i}]: a single request takes longer than the SLO ({slo_p99_ms} ms)"
                " even on an idle replica; no fence size can meet it"
            )
        replicas += r
        gpus_needed += r * svc.gpus_per_replica
        per_node_replicas = max(1, per_node // svc.gpus_per_replica)
        margin_gpus = max(margin_gpus, failure_margin * per_node_replicas * svc.gpus_per_replica)
    fence_nodes = math.ceil((gpus_needed + margin_gpus) / per_node)
    total_nodes = len(cluster.partition_nodes[serving]) + len(cluster.partition_nodes[training])
    if fence_nodes >= total_nodes:
        raise ValueError(
            f"the fence would need {fence_nodes} nodes; serving and training hold {total_nodes}"
        )
    # the autoscaler must be allowed to use the fence it gets
    services = [
        s.model_copy(update={"max_replicas": max(s.max_replicas, replicas)}) for s in sc.services
    ]
    sized = sc.model_copy(update={"services": services})
    runs: dict[int, dict[str, Any]] = {}
    for n in (fence_nodes, fence_nodes - 1):
        if n < 1:
            continue
        c = resize(cluster, serving, training, n)
        work, events = generate(sized, c)
        m = run_policy(sized, c, "fenced", work, events, check_invariants=False).metrics
        runs[n] = {
            "fence_nodes": n,
            "serving_slo_attainment": m["serving"]["slo_attainment"],
            "training_queue_delay_s": m["queue_delay_s"].get("training", {}),
            "training_jct_s": m["jct_s"].get("training", {}),
            "jobs_completed": m["completed"],
        }
    big, small = runs[fence_nodes], runs.get(fence_nodes - 1)
    current = len(cluster.partition_nodes[serving])
    lines = [
        f"Peak demand {peak_total:,.0f} req/s needs {replicas} replicas to keep p99 <= "
        f"{slo_p99_ms:g} ms (Erlang C, service {sc.services[0].service_ms:g} ms).",
        f"A margin of {failure_margin} node(s) adds {margin_gpus} GPUs: the fence is "
        f"{fence_nodes} nodes = {fence_nodes * per_node} GPUs (today: {current} nodes).",
        f"With it, serving SLO attainment is {big['serving_slo_attainment']:.2%} and training "
        f"waits p50 {big['training_queue_delay_s'].get('p50', 0):,.0f} s / "
        f"p99 {big['training_queue_delay_s'].get('p99', 0):,.0f} s.",
    ]
    if small is not None:
        dq = big["training_queue_delay_s"].get("p99", 0) - small["training_queue_delay_s"].get(
            "p99", 0
        )
        dj = big["training_jct_s"].get("p50", 0) - small["training_jct_s"].get("p50", 0)
        lines.append(
            f"One node less ({fence_nodes - 1}) would give serving "
            f"{small['serving_slo_attainment']:.2%} attainment; the last node costs training "
            f"{dq:+,.0f} s of p99 queue delay and {dj:+,.0f} s of median JCT."
        )
    return SizeAnswer(
        serving,
        training,
        peak_total,
        replicas,
        margin_gpus,
        fence_nodes,
        fence_nodes * per_node,
        current,
        big,
        small,
        lines,
    )
