"""One policy's run of a scenario, reduced to its object in metrics.json (``run_policy``);
the experiment over seeds and policies is ``sim.experiment.run_experiment``.

Schema (docs/architecture.md §9), one object per policy: submitted, completed, rejected,
queue_delay_s, jct_s, serving {p99_ms, slo_ms, slo_attainment}, gpu {utilization, allocation_ratio,
fragmentation}, preemptions {count, gpu_hours_lost, by_reason}, reclaims {count,
gpu_hours_returned}, invariant_violations — plus extras: the same delays over all jobs with the
unfinished ones censored at the horizon (queue_delay_all_s, jct_all_s, with counts), serving's
worst window and requests within the SLO, interconnect {link class: {p50, p95, max, mean}},
losses by cause (node failures included), lending {binds, gpu_hours}, per-service figures,
job states. Every figure's
definition: ``gpufence.telemetry``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Bind
from gpufence.model.lifecycle import JobState
from gpufence.sched.scheduler import SchedulerConfig
from gpufence.sim.contention import Contention
from gpufence.sim.generate import generate
from gpufence.sim.latency import INF
from gpufence.sim.policies import build_policy
from gpufence.sim.runner import SimResult, Simulation
from gpufence.sim.scenario import Scenario
from gpufence.sim.serving import Fleet, diurnal_rate
from gpufence.sim.summary import summarize
from gpufence.sim.timeline import Timeline
from gpufence.sim.workloads.records import At, WorkItem
from gpufence.telemetry.capacity import allocation_ratio, utilization
from gpufence.telemetry.incidents import lost_gpu_hours
from gpufence.telemetry.interconnect import link_class_summary


@dataclass
class PolicyRun:
    policy: str
    cluster: Cluster
    result: SimResult
    fleets: list[Fleet]
    timeline: Timeline
    metrics: dict[str, Any]


def rate_function(sc: Scenario, i: int) -> Callable[[float], float]:
    """Requests per second over time for service ``i``: generated or from a public trace."""
    demand = sc.services[i].demand
    if demand.diurnal is not None:
        return diurnal_rate(demand)
    assert demand.trace is not None
    kind, _, path = demand.trace.partition(":")
    from gpufence.sim.workloads import serving_traces as st

    if kind == "azure-llm" and path:
        curve = st.load_azure_llm(path, bin_s=demand.bin_s)
    elif kind == "sd" and path:
        curve = st.load_sd_requests(path, bin_s=demand.bin_s)
    else:
        raise ValueError(
            f"services[{i}].demand.trace: '{demand.trace}' (expected azure-llm:PATH or sd:PATH)"
        )
    scaled = curve.scaled(demand.scale)
    return lambda t: float(scaled.at(t))


def run_policy(
    sc: Scenario,
    base: Cluster,
    policy: str,
    work: list[WorkItem] | None = None,
    events: list[At] | None = None,
    check_invariants: bool = True,
    progress: Callable[[float], None] | None = None,
) -> PolicyRun:
    if work is None or events is None:
        work, events = generate(sc, base)
    pol = build_policy(policy, base)
    work = [replace(w, job=pol.adapt(w.job)) for w in work]
    contention = Contention(pol.cluster)
    fleets = [
        Fleet(svc, rate_function(sc, i), sc.horizon_s, contention, adapt=pol.adapt)
        for i, svc in enumerate(sc.services)
    ]
    timeline = Timeline(
        sc.sample_every_s,
        sc.horizon_s,
        contention.fabric,
        storage_gbps=sc.storage_gbps,
        checkpoint_gb_per_gpu=sc.checkpoint_gb_per_gpu,
    )
    sim = Simulation(
        pol.cluster,
        work,
        events,
        check_invariants=check_invariants,
        controllers=[*fleets, timeline],
        slowdown=contention,
        # the scenario's seed fixes the placement draws too (the random scorer, seeded tie order)
        config=SchedulerConfig(seed=sc.seed),
    )
    result = sim.run(until=sc.horizon_s, progress=progress)
    metrics = policy_metrics(sc, pol.cluster, result, fleets, timeline)
    return PolicyRun(policy, pol.cluster, result, fleets, timeline, metrics)


def _lending(result: SimResult) -> dict[str, float]:
    """Binds on GPUs another partition lent, and the GPU-hours they held those GPUs (to the
    run's end where still running): what a fence that lends gives training."""
    lent = {(d.job_id, t) for t, d in result.log if isinstance(d, Bind) and d.lent_from}
    held = sum(
        ((o.end if o.end is not None else result.end_time) - o.start) * len(o.gpus)
        for o in result.occupancy
        if (o.job_id, o.start) in lent
    )
    return {"binds": len(lent), "gpu_hours": _r(held / 3600.0, 3)}


def _r(x: float, n: int = 4) -> float:
    return round(float(x), n)


def _gpu_metrics(
    sc: Scenario, cluster: Cluster, result: SimResult, timeline: Timeline
) -> dict[str, Any]:
    """Utilization and allocation over the horizon, fragmentation, the largest placeable gang."""
    total = len(cluster.gpus)
    horizon = max(sc.horizon_s, 1e-9)
    samples = timeline.samples
    busy = sum(sum(x.busy.values()) for x in samples)
    util = utilization(busy, total * len(samples))
    caps = {p: len(g) for p, g in cluster.partition_gpus.items()}
    frag_by = {
        p: _r(sum(x.fragmentation.get(p, 0.0) for x in samples) / len(samples)) if samples else 0.0
        for p in cluster.partitions
    }
    # the cluster's fragmented share of capacity: each pool against its own reference request
    frag = sum(frag_by[p] * caps[p] for p in caps) / total if total else 0.0
    return {
        "utilization": _r(util),
        "allocation_ratio": _r(allocation_ratio(result.gpu_seconds_allocated, total * horizon)),
        "fragmentation": _r(frag),
        "fragmentation_by_partition": frag_by,
        "largest_placeable_gang_min": {
            p: min((x.largest_gang.get(p, 0) for x in samples), default=0)
            for p in cluster.partitions
        },
    }


def _serving_metrics(fleets: list[Fleet]) -> dict[str, Any]:
    """Each service's latency and replica figures, and all of them weighted by requests."""
    for f in fleets:
        f.score()
    services = {
        f.svc.name: {
            "p99_ms": _finite(f.p99_overall_ms()),
            "worst_window_p99_ms": _finite(f.worst_window_ms()),
            "slo_ms": f.svc.slo_p99_ms,
            "slo_attainment": _r(f.attainment(), 6),
            "requests_within_slo": _r(f.within_slo(), 6),
            "peak_replicas_running": max((w.replicas for w in f.windows), default=0),
            "peak_replicas_wanted": max((w.target for w in f.windows), default=0),
            # windows that ran with fewer replicas than the autoscaler wanted (GPUs not given)
            "windows_short_of_replicas": sum(1 for w in f.windows if w.replicas < w.target),
            "max_replica_shortfall": max((w.target - w.replicas for w in f.windows), default=0),
        }
        for f in fleets
    }
    weight = [sum(w.requests for w in f.windows) for f in fleets]
    wsum = sum(weight)

    def weighted(values: list[float]) -> float:
        return sum(v * wt for v, wt in zip(values, weight, strict=True)) / wsum if wsum else 1.0

    return {
        "p99_ms": _finite(max((f.p99_overall_ms() for f in fleets), default=0.0)),
        "worst_window_p99_ms": _finite(max((f.worst_window_ms() for f in fleets), default=0.0)),
        "slo_ms": min((f.svc.slo_p99_ms for f in fleets), default=0.0),
        "slo_attainment": _r(weighted([f.attainment() for f in fleets]), 6),
        "requests_within_slo": _r(weighted([f.within_slo() for f in fleets]), 6),
        "services": services,
    }


def _returned_gpu_s(result: SimResult) -> float:
    """GPU-seconds reclaimed jobs still wanted when they were taken back (from first start)."""
    returned = 0.0
    for tr in result.jobs.values():
        if tr.state is JobState.RECLAIMED and tr.end is not None and tr.first_start is not None:
            left = tr.item.duration_s - (tr.end - tr.first_start)
            returned += max(0.0, left) * tr.item.job.total_gpus
    return returned


def _preemptions_and_reclaims(result: SimResult) -> tuple[dict[str, Any], dict[str, Any]]:
    c = result.counters
    pre: dict[str, int] = {str(k): int(v) for k, v in dict(c["preemptions"]).items()}  # type: ignore[call-overload]
    rec: dict[str, int] = {str(k): int(v) for k, v in dict(c["reclaims"]).items()}  # type: ignore[call-overload]
    lost = lost_gpu_hours(result.lost_gpu_s)
    preemptions = {
        "count": sum(pre.values()),
        "gpu_hours_lost": _r(lost["total"], 3),
        "gpu_hours_lost_by_cause": {k: _r(v, 3) for k, v in sorted(lost.items()) if k != "total"},
        "by_reason": dict(sorted(pre.items())),
    }
    reclaims = {
        "count": sum(rec.values()),
        "gpu_hours_returned": _r(_returned_gpu_s(result) / 3600.0, 3),
        "by_reason": dict(sorted(rec.items())),
    }
    return preemptions, reclaims


def _storage_metrics(result: SimResult, timeline: Timeline) -> dict[str, Any]:
    samples = timeline.samples
    return {
        "checkpoint_writes": len(result.checkpoints),
        "utilization_mean": _r(sum(x.storage_util for x in samples) / len(samples))
        if samples
        else 0.0,
        "utilization_peak": _r(max((x.storage_util for x in samples), default=0.0)),
    }


def policy_metrics(
    sc: Scenario, cluster: Cluster, result: SimResult, fleets: list[Fleet], timeline: Timeline
) -> dict[str, Any]:
    s = summarize(result, len(cluster.gpus), horizon=sc.horizon_s)
    gpu = _gpu_metrics(sc, cluster, result, timeline)
    preemptions, reclaims = _preemptions_and_reclaims(result)
    serving = _serving_metrics(fleets)
    return {
        "submitted": s["submitted"],
        "completed": s["completed"],
        "rejected": s["rejected"],
        "pending_at_end": s["pending_at_end"],
        "states": s["states"],
        "queue_delay_s": s["queue_delay_s"],
        "queue_delay_all_s": s["queue_delay_all_s"],
        "jct_s": s["jct_s"],
        "jct_all_s": s["jct_all_s"],
        "serving": serving,
        "gpu": gpu,
        "interconnect": link_class_summary(
            (x.links for x in timeline.samples),
            timeline.fabric.link_class,
            timeline.fabric.links_per_class(),
        ),
        "preemptions": preemptions,
        "reclaims": reclaims,
        "lending": _lending(result),
        "storage": _storage_metrics(result, timeline),
        "rerates": result.rerates,
        "invariant_violations": result.invariant_violations,
    }


def _finite(x: float) -> float | None:
    """JSON has no infinity: an overloaded p99 is reported as null."""
    return None if x == INF else _r(x, 3)
