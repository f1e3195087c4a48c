"""``gpufence size``: the smallest serving fence that keeps p99 within the SLO at peak with K
node failures, tested by simulation, and what its failure margin costs training.

1. Peak demand: the highest request rate of each service over the scenario's horizon.
2. Replicas: the fewest whose p99 response time at that peak is within the SLO
   (``sim.latency``: exact Erlang-C sizing for exponential service; the M/G/c approximation
   otherwise).
3. Nodes: the replicas packed whole onto nodes (a replica never spans two; GPUs left over on a
   node are stranded), plus a failure margin of K whole nodes: the fence.
4. Validation, over several seeds (the ``fenced`` policy, nodes moved between the serving and
   training partitions): the fence, and the fence without its margin (K nodes less), each with
   K of the fence's nodes failed across the peak (seeded choice, for the scenario's repair time
   or an hour, centred on the peak) — so the margin is tested, not assumed. Reported: serving
   SLO attainment of both with 95 % intervals, and the margin's cost to training: the paired
   per-seed difference of training's p99 queue delay and median JCT, both over all jobs with
   the unfinished ones censored at the horizon, in hours with their 95 % interval.
   A fence whose own validation attains less than 99 % is not answered (a ValueError names the
   figures), nor is one an autoscaler that stays below the SLO's replicas at peak would waste.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from gpufence.model.cluster import Cluster
from gpufence.model.events import NodeDown, NodeUp
from gpufence.model.job import WorkloadClass
from gpufence.sim.generate import generate
from gpufence.sim.headline import figure, interval_dict
from gpufence.sim.latency import replicas_for_slo
from gpufence.sim.policy_run import rate_function, run_policy
from gpufence.sim.report_text import dur
from gpufence.sim.scenario import Scenario
from gpufence.sim.workloads.records import At


@dataclass(frozen=True)
class SizeAnswer:
    serving_partition: str
    training_partition: str
    peak_rps: float
    peak_at_s: float
    replicas_at_peak: int
    margin_replicas: int
    fence_nodes: int
    fence_gpus: int
    current_nodes: int
    seeds: list[int]
    runs: list[dict[str, Any]]  # one per (fence size, seed)
    summary: dict[str, Any]  # intervals per fence size, margin cost
    explanation: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def fence_failures(
    cluster: Cluster, serving: str, k: int, peak_at: float, down_s: float, seed: int
) -> list[At]:
    """K of the fence's nodes down for ``down_s`` centred on the peak (seeded choice)."""
    nodes = list(cluster.partition_nodes[serving])
    if k <= 0 or not nodes:
        return []
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(nodes), size=min(k, len(nodes)), replace=False)
    start = max(0.0, peak_at - down_s / 2)
    out: list[At] = []
    for i in sorted(int(x) for x in picked):
        name = cluster.nodes[nodes[i]].name
        out += [At(start, NodeDown(name)), At(start + down_s, NodeUp(name))]
    return out


def _run(
    sc: Scenario, cluster: Cluster, serving: str, nodes: int, k: int, peak_at: float, seed: int
) -> dict[str, Any]:
    s = sc.model_copy(update={"seed": seed})
    c = resize(cluster, serving, _partition_with(cluster, WorkloadClass.TRAINING, serving), nodes)
    work, events = generate(s, c)
    down_s = sc.failures.repair_s if sc.failures is not None else 3600.0
    events = sorted(
        [*events, *fence_failures(c, serving, k, peak_at, down_s, seed)], key=lambda a: a.time
    )
    m = run_policy(s, c, "fenced", work, events, check_invariants=False).metrics
    return {
        "fence_nodes": nodes,
        "seed": seed,
        "failed_fence_nodes": k,
        "serving_slo_attainment": m["serving"]["slo_attainment"],
        "serving_worst_window_p99_ms": m["serving"]["worst_window_p99_ms"],
        "training_queue_delay_p99_all_s": figure(m, "queue_delay_all_s.training.p99") or 0.0,
        "training_jct_p50_all_s": figure(m, "jct_all_s.training.p50") or 0.0,
        "training_censored": figure(m, "queue_delay_all_s.training.censored") or 0.0,
        "jobs_completed": m["completed"],
        "preemptions": m["preemptions"]["count"],
    }


def _hours(iv: dict[str, Any]) -> str:
    return (
        f"{iv['mean'] / 3600:+.2f} h [{iv['ci95_low'] / 3600:+.2f}, {iv['ci95_high'] / 3600:+.2f}]"
    )


def _peak_demand(
    sc: Scenario, slo_p99_ms: float, per_node: int, failure_margin: int
) -> tuple[float, float, int, int, list[int]]:
    """Serving's peak: total request rate, when the largest service peaks, the replicas every
    service needs then (Erlang C), the margin's GPUs, and the GPUs of each replica."""
    peak_total, peak_at, replicas, margin_gpus = 0.0, 0.0, 0, 0
    sizes: list[int] = []  # GPUs of every replica needed at peak
    for i, svc in enumerate(sc.services):
        rate = rate_function(sc, i)
        times = range(0, int(sc.horizon_s) + 1, 60)
        t_peak = max(times, key=rate)
        peak = rate(t_peak)
        if peak > peak_total:
            peak_at = float(t_peak)
        peak_total += peak
        r = replicas_for_slo(peak, svc.service_ms / 1000.0, slo_p99_ms / 1000.0, svc.service_cv)
        if r is None:
            raise ValueError(
                f"services[{i}]: a single request takes longer than the SLO ({slo_p99_ms} ms)"
                " at p99 even on an idle replica; no fence size can meet it"
            )
        _autoscaler_reaches(i, svc.target_utilization, peak, svc.service_ms, r)
        replicas += r
        sizes += [svc.gpus_per_replica] * r
        per_node_replicas = max(1, per_node // svc.gpus_per_replica)
        margin_gpus = max(margin_gpus, failure_margin * per_node_replicas * svc.gpus_per_replica)
    return peak_total, peak_at, replicas, margin_gpus, sizes


def size_fence(
    sc: Scenario,
    cluster: Cluster,
    slo_p99_ms: float,
    failure_margin: int = 1,
    seeds: Sequence[int] | None = None,
) -> SizeAnswer:
    if not sc.services:
        raise ValueError("the scenario has no services to size a fence for")
    seeds = list(seeds) if seeds else [sc.seed, sc.seed + 1, sc.seed + 2]
    serving = _partition_with(cluster, WorkloadClass.SERVING)
    training = _partition_with(cluster, WorkloadClass.TRAINING, exclude=serving)
    per_node = min(
        len(cluster.node_partition_gpus[(serving, n)]) for n in cluster.partition_nodes[serving]
    )
    peak_total, peak_at, replicas, margin_gpus, sizes = _peak_demand(
        sc, slo_p99_ms, per_node, failure_margin
    )
    # replicas never span nodes: a node holds per_node // gpus_per_replica of them and the
    # rest of its GPUs are stranded (3-GPU replicas on 8-GPU nodes: 2 per node, not 8/3); the
    # margin is K whole nodes, what K failed nodes take away
    fence_nodes = pack_nodes(sizes, per_node) + failure_margin
    total_nodes = len(cluster.partition_nodes[serving]) + len(cluster.partition_nodes[training])
    if fence_nodes >= total_nodes:
        raise ValueError(
            f"the fence would need {fence_nodes} nodes; serving and training hold {total_nodes}"
        )
    # the autoscaler must be allowed to use the fence it gets
    services = [
        s.model_copy(update={"max_replicas": max(s.max_replicas, fence_nodes * per_node)})
        for s in sc.services
    ]
    sized = sc.model_copy(update={"services": services})
    bare = max(1, fence_nodes - max(failure_margin, 1))
    runs = [
        _run(sized, cluster, serving, n, failure_margin, peak_at, seed)
        for n in (fence_nodes, bare)
        for seed in seeds
    ]
    summary = _summarise(runs, fence_nodes, bare)
    _passes_validation(summary["fence"], fence_nodes, seeds)
    current = len(cluster.partition_nodes[serving])
    big, small, cost = summary["fence"], summary["without_margin"], summary["margin_cost"]
    lines = [
        f"Peak demand {peak_total:,.0f} req/s (at {dur(peak_at)}) needs {replicas} replicas to "
        f"keep p99 <= {slo_p99_ms:g} ms (exact Erlang C for exponential service; service "
        f"{sc.services[0].service_ms:g} ms).",
        f"A margin of {failure_margin} node(s) adds {margin_gpus} GPUs: the fence is "
        f"{fence_nodes} nodes = {fence_nodes * per_node} GPUs (today: {current} nodes).",
        f"Tested over seeds {', '.join(map(str, seeds))} with {failure_margin} fence node(s) "
        f"failed across the peak: serving SLO attainment {_att(big)} with the fence, "
        f"{_att(small)} with {bare} nodes (no margin).",
        f"The margin costs training {_hours(cost['training_queue_delay_p99_all_s'])}"
        f" of p99 queue delay and {_hours(cost['training_jct_p50_all_s'])} of "
        "median JCT (mean [95 % interval] over the seeds; all jobs, the unfinished ones counted "
        "at the horizon).",
    ]
    small_pre = sum(r["preemptions"] for r in runs if r["fence_nodes"] == bare)
    if small["serving_slo_attainment"]["mean"] >= 0.999 and small_pre:
        lines.append(
            f"Without the margin serving still met its SLO: incident preemption of training "
            f"({small_pre} preemptions over the seeds) covered the failed node(s); the margin "
            "buys not needing it."
        )
    return SizeAnswer(
        serving,
        training,
        peak_total,
        peak_at,
        replicas,
        margin_gpus,
        fence_nodes,
        fence_nodes * per_node,
        current,
        seeds,
        runs,
        summary,
        lines,
    )


REQUIRED_ATTAINMENT = 0.99  # a fence whose validation attains less is not an answer


def pack_nodes(sizes: list[int], per_node: int) -> int:
    """Nodes of ``per_node`` GPUs that hold replicas of ``sizes`` GPUs each, none spanning
    two nodes (first fit, largest first)."""
    free: list[int] = []
    for size in sorted(sizes, reverse=True):
        for i, left in enumerate(free):
            if left >= size:
                free[i] -= size
                break
        else:
            free.append(per_node - size)
    return len(free)


def _autoscaler_reaches(i: int, target: float, peak: float, service_ms: float, need: int) -> None:
    """The sized fence is validated with the scenario's autoscaler: one that keeps fewer
    replicas at peak than the SLO needs makes every fence size miss, whatever it holds."""
    scaled = math.ceil(peak * service_ms / 1000.0 / target)
    if scaled < need:
        most = peak * service_ms / 1000.0 / need
        raise ValueError(
            f"services[{i}].target_utilization {target:g}: at the peak the autoscaler keeps "
            f"{scaled} replicas, and the SLO needs {need}; no fence size can meet it -- set "
            f"target_utilization to at most {math.floor(most * 100) / 100:g}"
        )


def _passes_validation(fence: dict[str, Any], nodes: int, seeds: list[int]) -> None:
    """The answer must pass its own validation: a fence that misses the SLO in the simulation
    that tests it is not a size to deploy."""
    att = fence["serving_slo_attainment"]
    if att["mean"] < REQUIRED_ATTAINMENT:
        raise ValueError(
            f"the sized fence ({nodes} nodes) fails its own validation: serving SLO attainment "
            f"{_att(fence)} over seeds {', '.join(map(str, seeds))}, below the "
            f"{REQUIRED_ATTAINMENT:.0%} an answer needs; look at the scenario's services "
            "(autoscaling, service time CV) and the failure margin"
        )


def _att(s: dict[str, Any]) -> str:
    iv = s["serving_slo_attainment"]
    return f"{iv['mean']:.2%} [{iv['ci95_low']:.2%}, {iv['ci95_high']:.2%}]"


def _summarise(runs: list[dict[str, Any]], big: int, small: int) -> dict[str, Any]:
    keys = (
        "serving_slo_attainment",
        "training_queue_delay_p99_all_s",
        "training_jct_p50_all_s",
        "preemptions",
    )
    by = {n: [r for r in runs if r["fence_nodes"] == n] for n in (big, small)}
    out: dict[str, Any] = {
        "fence": {k: interval_dict([r[k] for r in by[big]]) for k in keys},
        "without_margin": {k: interval_dict([r[k] for r in by[small]]) for k in keys},
    }
    pairs = list(zip(by[big], by[small], strict=True))
    out["margin_cost"] = {k: interval_dict([a[k] - b[k] for a, b in pairs]) for k in keys[1:]}
    return out
