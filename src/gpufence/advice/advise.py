"""Live advice: the spec rules with the history's numbers, then every live rule.

``advise(cluster, history, settings)`` is what ``gpufence advise`` / ``GET /v1/advice`` and the
simulator's report call. For a tenant (``tenant=``) only job-scoped rules run, over that
tenant's jobs alone: a tenant learns about its own jobs, never about other tenants' or the
cluster's sizing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gpufence.advice import catalog
from gpufence.advice.history import History
from gpufence.advice.inputs import AdviceSettings, GangInput, LintInputs
from gpufence.advice.lint import lint_cluster
from gpufence.advice.live_capacity import (
    fragmentation_stranding,
    idle_interactive,
    lending_loses_work,
)
from gpufence.advice.live_serving import (
    batch_in_serving,
    chronic_preemption,
    largest_gangs,
    serving_peak,
)
from gpufence.advice.record import Advice, Scope
from gpufence.advice.shape import serving_partitions
from gpufence.model.cluster import Cluster

LiveRule = Callable[[Cluster, History, AdviceSettings, LintInputs], list[Advice]]

LIVE_RULES: dict[str, tuple[LiveRule, Scope]] = {
    catalog.CHRONIC_PREEMPTION: (chronic_preemption, Scope.CLUSTER),
    catalog.BATCH_IN_SERVING: (batch_in_serving, Scope.JOBS),
    catalog.IDLE_INTERACTIVE: (idle_interactive, Scope.JOBS),
    catalog.LENDING_LOSES_WORK: (lending_loses_work, Scope.JOBS),
    catalog.FRAGMENTATION_STRANDING: (fragmentation_stranding, Scope.CLUSTER),
}


def history_inputs(cluster: Cluster, h: History, base: LintInputs) -> LintInputs:
    """``base`` plus the serving peaks and training gangs the history shows, where ``base``
    (a scenario's sizing) gives none: what replicas an autoscaler asked for includes its
    headroom, the sizing's Erlang-C peak does not."""
    peaks = tuple(
        p
        for s in serving_partitions(cluster)
        if base.peak(s) is None and (p := serving_peak(cluster, h, s))
    )
    gangs = tuple(
        GangInput(part, int(j.gpus), f"history: job {j.id}")
        for part, j in largest_gangs(h).items()
        if part in cluster.partitions and j.gpus >= 1
    )
    return replace(base, peaks=base.peaks + peaks, gangs=base.gangs + gangs)


def advise(
    cluster: Cluster,
    history: History,
    settings: AdviceSettings | None = None,
    inputs: LintInputs | None = None,
    tenant: str | None = None,
) -> list[Advice]:
    cfg = settings or AdviceSettings()
    base = replace(
        inputs or LintInputs(),
        failure_margin_nodes=cfg.failure_margin_nodes,
        ignore=tuple(cfg.ignore) + (inputs.ignore if inputs else ()),
    )
    if tenant is not None:
        h = history.for_tenant(tenant)
        out: list[Advice] = []
    else:
        h = history
        base = history_inputs(cluster, h, base)
        out = lint_cluster(cluster, base)
    for rule, (check, scope) in LIVE_RULES.items():
        if rule in base.ignore or (tenant is not None and scope is Scope.CLUSTER):
            continue
        out += [a.located(base.lines) for a in check(cluster, h, cfg, base)]
    # chronic preemption already says how big the reserve must be, from the same peak
    chronic = {a.path for a in out if a.rule == catalog.CHRONIC_PREEMPTION}
    return [
        a for a in out if not (a.rule == catalog.SERVING_NO_FAILURE_MARGIN and a.path in chronic)
    ]
