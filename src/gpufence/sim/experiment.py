"""The experiment as a library: a workload run under several policies over one or more seeds,
reduced to ``metrics.json`` with each policy's advice.

    from gpufence.sim.experiment import run_experiment
    from gpufence.sim.inputs import FileInputs
    from gpufence.sim.outputs import write_outputs

    files = FileInputs.open(Path("cluster.yaml"), Path("scenario.yaml"))
    result = run_experiment(files, ["fenced", "fenced-lend"], seeds=[1, 2, 3])
    write_outputs(result, Path("out"))  # metrics.json, report.html, events.csv

``gpufence sim`` is this call between its argument checks and its tables. ``result.metrics`` is
the top of ``metrics.json``: the scenario, the cluster, the first seed and its ``policies``
(docs/architecture.md §9, one object per policy from ``sim.policy_run``), and with several seeds
``seeds``, ``by_seed``, ``intervals`` (each headline figure's mean and 95 % interval,
``sim.headline``) and ``paired`` (each policy's per-seed difference from the first policy's,
mean and 95 % interval). The advice (``sim.advice_run``) is that of the first seed's runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from gpufence.model.cluster import Cluster
from gpufence.sim.advice_run import add_advice
from gpufence.sim.headline import headline_intervals, paired_differences
from gpufence.sim.inputs import SeedInputs
from gpufence.sim.policy_run import PolicyRun, run_policy
from gpufence.sim.scenario import Scenario

Tick = Callable[[float], None]
"""Called with the simulated time as a run advances."""


class Watch:
    """What a front end shows while an experiment runs; this one shows nothing. The CLI's
    prints a trace's note, lints the cluster once and draws one progress bar per seed."""

    def loaded(self, index: int, inputs: SeedInputs) -> None:
        """The ``index``-th seed's inputs are loaded; its runs come next."""

    def seed(self, index: int, inputs: SeedInputs) -> AbstractContextManager[None]:
        """Held while that seed's policies run."""
        return nullcontext()

    def policy(self, index: int, sc: Scenario, policy: str) -> Tick | None:
        """A policy's run starts: what follows its progress (None: nothing)."""
        return None


@dataclass
class ExperimentResult:
    scenario: Scenario  # the first seed's (seeds differ in nothing else)
    cluster: Cluster  # as the inputs gave it, before a policy reshapes it
    by_seed: dict[int, list[PolicyRun]]  # one run per policy, in the order asked
    metrics: dict[str, Any]  # the top of metrics.json, advice included
    intervals: dict[str, dict[str, dict[str, Any]]] | None  # several seeds only
    paired: dict[str, dict[str, dict[str, Any]]] | None = None  # several seeds and policies

    @property
    def seeds(self) -> list[int]:
        return list(self.by_seed)

    @property
    def runs(self) -> list[PolicyRun]:
        """The first seed's runs: those the report draws and the advice reads."""
        return self.by_seed[self.seeds[0]]


def run_experiment(
    inputs: Callable[[int | None], SeedInputs],
    policies: Sequence[str],
    seeds: Sequence[int | None] = (None,),
    watch: Watch | None = None,
) -> ExperimentResult:
    """Run every policy of ``policies`` on the inputs of every seed (``inputs(seed)``, e.g. a
    ``sim.inputs.FileInputs``; a None seed is the scenario's own) and reduce the runs to
    ``metrics.json`` with advice. Seeds that load to the same scenario seed run once."""
    watch = watch if watch is not None else Watch()
    by_seed: dict[int, list[PolicyRun]] = {}
    first: SeedInputs | None = None
    for seed in seeds:
        loaded = inputs(seed)
        index = len(by_seed)
        watch.loaded(index, loaded)
        first = first if first is not None else loaded
        by_seed[loaded.scenario.seed] = _run_seed(loaded, policies, index, watch)
    if first is None:
        raise ValueError("an experiment needs at least one seed")
    sc = first.scenario
    runs = by_seed[next(iter(by_seed))]
    metrics: dict[str, Any] = {
        "scenario": sc.name,
        "cluster": first.cluster.name,
        "seed": next(iter(by_seed)),
        "horizon_s": sc.horizon_s,
        "policies": {r.policy: r.metrics for r in runs},
    }
    intervals = None
    if len(by_seed) > 1:
        metrics["seeds"] = list(by_seed)
        metrics["by_seed"] = {str(k): {r.policy: r.metrics for r in v} for k, v in by_seed.items()}
        per_policy = {p: [_by_policy(v)[p] for v in by_seed.values()] for p in policies}
        intervals = headline_intervals(per_policy)
        metrics["intervals"] = intervals
        paired = paired_differences(per_policy) or None
        if paired:
            metrics["paired"] = {"baseline": policies[0], "policies": paired}
    else:
        paired = None
    add_advice(metrics, sc, runs)  # metrics["policies"][P]["advice"]: why each policy loses
    return ExperimentResult(sc, first.cluster, by_seed, metrics, intervals, paired)


def _by_policy(runs: list[PolicyRun]) -> dict[str, dict[str, Any]]:
    return {r.policy: r.metrics for r in runs}


def _run_seed(
    inputs: SeedInputs, policies: Sequence[str], index: int, watch: Watch
) -> list[PolicyRun]:
    sc, runs = inputs.scenario, list[PolicyRun]()
    with watch.seed(index, inputs):
        for name in policies:
            tick = watch.policy(index, sc, name)
            runs.append(
                run_policy(sc, inputs.cluster, name, inputs.work, inputs.events, progress=tick)
            )
            if tick is not None:  # a run can end before the horizon: show it complete
                tick(sc.horizon_s)
    return runs
