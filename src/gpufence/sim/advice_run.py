"""The advice rules over a simulated run: the scenario gives the spec rules their numbers (the
serving peak through the same Erlang-C sizing as ``gpufence size``, the SLO and its window, the
largest training gang), and the run gives the live rules their history.

``policy_advice(sc, run)`` is what ``gpufence sim`` puts in ``metrics.json`` (``advice`` per
policy) and ``report.html``; ``scenario_inputs`` is what ``sim`` and ``size`` lint the cluster
file with at start-up.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpufence.advice.advise import advise
from gpufence.advice.history import (
    ENDED_BY_CANCEL,
    ENDED_BY_ITSELF,
    ENDED_BY_SCHEDULER,
    AttemptSpan,
    History,
    JobSpan,
    Mark,
)
from gpufence.advice.inputs import AdviceSettings, GangInput, LintInputs, ServingPeak, SloInput
from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Bind, Decision, Notice, NoticeWithdrawn, Stop
from gpufence.model.job import MILLI_PER_GPU, Job, RequestKind, WorkloadClass
from gpufence.sim.latency import replicas_for_slo
from gpufence.sim.policy_run import PolicyRun, rate_function
from gpufence.sim.runner import JobTrace, Occupancy, SimResult
from gpufence.sim.scenario import Scenario

_MIG_SLICES = re.compile(r"^(\d+)g\.")
_TERMINAL = ("done", "failed", "rejected", "cancelled", "reclaimed")


def _home(cluster: Cluster, partition: str, queue: str, cls: WorkloadClass) -> str:
    """Where a scenario item lands in ``cluster`` (a policy may have merged the partitions)."""
    if queue in cluster.queues and cluster.queues[queue].partition in cluster.partitions:
        return cluster.queues[queue].partition
    if partition in cluster.partitions:
        return partition
    return next((p for p, part in cluster.partitions.items() if cls in part.admits), "")


def scenario_inputs(sc: Scenario, cluster: Cluster) -> LintInputs:
    """Serving peaks (peak req/s -> replicas for the SLO, as ``gpufence size`` step 1-2), SLOs
    with their windows (the autoscaler's scoring window), and the largest training gang."""
    peaks: dict[str, float] = {}
    why: dict[str, list[str]] = {}
    slos: list[SloInput] = []
    for i, svc in enumerate(sc.services):
        p = _home(cluster, svc.partition, svc.queue, WorkloadClass.SERVING)
        if not p:
            continue
        rate = rate_function(sc, i)
        top = max(rate(t) for t in range(0, int(sc.horizon_s) + 1, 60))
        r = replicas_for_slo(top, svc.service_ms / 1000, svc.slo_p99_ms / 1000, svc.service_cv)
        if r is not None:
            peaks[p] = peaks.get(p, 0.0) + r * svc.gpus_per_replica
            why.setdefault(p, []).append(
                f"{svc.name} peaks at {top:,.0f} req/s = {r} replicas for p99 <= "
                f"{svc.slo_p99_ms:g} ms"
            )
        slos.append(
            SloInput(
                p,
                svc.slo_p99_ms,
                svc.autoscale_every_s,
                False,
                f"scenario service {svc.name}, judged every {svc.autoscale_every_s:g} s",
            )
        )
    gangs: list[GangInput] = []
    tr = sc.training
    if tr is not None and any(w > 0 for w in tr.gang_sizes.values()):
        size = max(s for s, w in tr.gang_sizes.items() if w > 0)
        queues = tr.queues or [""]
        for p in {_home(cluster, tr.partition, q, WorkloadClass.TRAINING) for q in queues}:
            if p:
                gangs.append(GangInput(p, size, "scenario training.gang_sizes"))
    return LintInputs(
        peaks=tuple(ServingPeak(p, g, "scenario: " + "; ".join(why[p])) for p, g in peaks.items()),
        slos=tuple(slos),
        gangs=tuple(gangs),
    )


def _gpus(job: Job) -> float:
    req = job.request
    if req.kind is RequestKind.MIG:
        m = _MIG_SLICES.match(req.mig_profile or "")
        return job.replicas * (int(m.group(1)) / 7 if m else 1.0)
    if req.kind is RequestKind.FRACTION:
        return job.replicas * req.milli / MILLI_PER_GPU
    return float(job.total_gpus)


_Stops = dict[str, list[tuple[float, Stop]]]


def _read_log(
    log: list[tuple[float, Decision]],
) -> tuple[dict[str, list[Bind]], _Stops, list[Mark]]:
    """The decision log by job: its binds (one per attempt, in order), its stops with their
    times, and the marks (stops, notices, withdrawn notices) the live rules quote."""
    binds: dict[str, list[Bind]] = {}
    stops: _Stops = {}
    marks: list[Mark] = []
    for t, d in log:
        if isinstance(d, Bind):
            binds.setdefault(d.job_id, []).append(d)
        elif isinstance(d, Stop):
            stops.setdefault(d.job_id, []).append((t, d))
            marks.append(Mark(t, d.job_id, "stop", str(d.reason)))
        elif isinstance(d, Notice):
            marks.append(Mark(t, d.job_id, "notice", str(d.reason)))
        elif isinstance(d, NoticeWithdrawn):
            marks.append(Mark(t, d.job_id, "notice-withdrawn", str(d.reason)))
    return binds, stops, marks


def _attempt_span(
    c: Cluster, res: SimResult, occ: Occupancy, k: int, bind: list[Bind], stops: _Stops
) -> AttemptSpan:
    """The ``k``-th (0-based) attempt of ``occ``'s job: where it ran, whether it was lent, and
    what it lost if it was stopped (all since its last periodic checkpoint, unless it acked)."""
    lent = bind[k].lent_from if k < len(bind) else None
    end = occ.end
    stop = next(
        (d for t, d in stops.get(occ.job_id, ()) if occ.start <= t and (end is None or t <= end)),
        None,
    )
    tr = res.jobs[occ.job_id]
    every = tr.item.checkpoint_every_s
    ran = (end if end is not None else res.end_time) - occ.start
    acked = stop is not None and stop.message == "checkpoint acknowledged"
    lost = 0.0 if acked else (ran % every if every else ran)
    part = c.gpus[occ.gpus[0]].partition if occ.gpus else ""
    return AttemptSpan(
        occ.job_id,
        k + 1,
        part,
        lent,
        occ.gpus if occ.exclusive else (),
        _gpus(tr.item.job),
        occ.start,
        end,
        str(stop.reason) if stop is not None else "",
        acked,
        lost if stop is not None else None,
    )


def _job_span(c: Cluster, jid: str, tr: JobTrace, slo: dict[str, float]) -> JobSpan:
    job = tr.item.job
    q = c.queues.get(job.queue)
    ended = tr.end if tr.state in _TERMINAL else None
    by = {"done": ENDED_BY_ITSELF, "cancelled": ENDED_BY_CANCEL}.get(
        tr.state, ENDED_BY_SCHEDULER if ended is not None else ""
    )
    return JobSpan(
        id=jid,
        tenant=(q.tenant or q.name) if q is not None else job.queue,
        workload_class=str(job.workload_class),
        partition=_home(c, job.partition, job.queue, job.workload_class),
        gpus=_gpus(job),
        replicas=job.replicas,
        per_replica=job.request.gpus,
        submitted=tr.submitted,
        ended=ended,
        state=tr.state,
        ended_by=by,
        checkpointable=job.checkpointable,
        est_runtime_s=job.est_runtime_s,
        # fleet replicas serve a scenario service: they carry its SLO
        slo_p99_ms=slo.get(job.queue) or slo.get(job.partition)
        if job.workload_class is WorkloadClass.SERVING
        else None,
        queue=job.queue,
    )


def run_history(sc: Scenario, run: PolicyRun) -> History:
    """The run as the live rules read it (simulated seconds, 0 .. horizon)."""
    c = run.cluster
    res = run.result
    slo = {s.queue or s.partition: s.slo_p99_ms for s in sc.services}
    binds, stops, marks = _read_log(res.log)
    attempts: list[AttemptSpan] = []
    seen: dict[str, int] = {}
    for occ in res.occupancy:
        # the occupancies of a job come in attempt order, as its binds do
        k = seen.get(occ.job_id, 0)
        seen[occ.job_id] = k + 1
        attempts.append(_attempt_span(c, res, occ, k, binds.get(occ.job_id, []), stops))
    jobs = [_job_span(c, jid, tr, slo) for jid, tr in res.jobs.items()]
    return History(
        0.0,
        max(sc.horizon_s, res.end_time),
        tuple(jobs),
        tuple(attempts),
        tuple(marks),
        f"simulated run ({run.policy})",
        wall_clock=False,
    )


def policy_advice(
    sc: Scenario, run: PolicyRun, settings: AdviceSettings | None = None
) -> list[dict[str, Any]]:
    """The advice for one policy's run, as ``metrics.json`` holds it."""
    inputs = scenario_inputs(sc, run.cluster)
    found = advise(run.cluster, run_history(sc, run), settings, inputs)
    return [a.to_json() for a in found]


def add_advice(metrics: Mapping[str, Any], sc: Scenario, runs: list[PolicyRun]) -> None:
    """``metrics["policies"][name]["advice"] = [...]`` for every run (in place)."""
    for run in runs:
        metrics["policies"][run.policy]["advice"] = policy_advice(sc, run)
