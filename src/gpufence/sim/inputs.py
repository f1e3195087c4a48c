"""The inputs of a simulation, one seed at a time: the scenario, the cluster, the jobs and the
cluster events, from a scenario YAML (generated) or a public trace (replayed on its own times).

``FileInputs.open(cluster, workload)`` names the files once (and finds the trace's format);
calling it with a seed loads that seed's ``SeedInputs`` — what ``sim.experiment.run_experiment``
runs each policy on. ``load_inputs`` is the scenario path alone (``gpufence size``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from gpufence.model.cluster import Cluster
from gpufence.sim.generate import generate
from gpufence.sim.policies import with_placement
from gpufence.sim.scenario import Scenario, load_scenario
from gpufence.sim.workloads.records import At, WorkItem
from gpufence.spec import SpecError, load_cluster


@dataclass(frozen=True)
class SeedInputs:
    """One seed's workload on its cluster."""

    scenario: Scenario
    cluster: Cluster
    work: list[WorkItem]
    events: list[At]
    note: str | None = None
    """A trace's one line for the console (what was read, what was left out); None for a
    scenario."""


def check_scenario(sc: Scenario, cluster: Cluster) -> None:
    """Scenario fields that name partitions or queues must exist in the cluster."""
    # (field, the name it gives, whether it names a queue: else a partition)
    named: list[tuple[str, str, bool]] = []
    for i, svc in enumerate(sc.services):
        if svc.queue:
            named.append((f"services[{i}].queue", svc.queue, True))
        else:
            named.append((f"services[{i}].partition", svc.partition, False))
    if sc.training is not None:
        named += [(f"training.queues[{i}]", q, True) for i, q in enumerate(sc.training.queues)]
        if not sc.training.queues:
            named.append(("training.partition", sc.training.partition, False))
    if sc.notebooks is not None:
        named.append(("notebooks.partition", sc.notebooks.partition, False))
    if sc.batch is not None:
        named.append(("batch.partition", sc.batch.partition, False))
    problems = [p for f, name, queue in named if (p := _unknown(cluster, f, name, queue))]
    if problems:
        raise SpecError(problems, kind="scenario")


def _unknown(cluster: Cluster, path: str, name: str, queue: bool) -> str | None:
    """What is wrong with ``name`` at ``path``: None when the cluster has it (or, for a queue,
    when none is named)."""
    if queue:
        if not name or name in cluster.queues:
            return None
        known = ", ".join(cluster.queues)
        return f"{path}: '{name}' is not a queue of {cluster.name} (known: {known})"
    if name in cluster.partitions:
        return None
    known = ", ".join(cluster.partitions)
    return f"{path}: '{name}' is not a partition of {cluster.name} (known: {known})"


def load_inputs(cluster_path: Path, workload: Path, seed: int | None) -> tuple[Scenario, Cluster]:
    """A scenario YAML (its seed replaced by ``seed`` unless None) and the cluster it runs on."""
    sc, _ = load_scenario(workload)
    if seed is not None:
        sc = sc.model_copy(update={"seed": seed})
    cluster = load_cluster(cluster_path)
    check_scenario(sc, cluster)
    return sc, cluster


def trace_format(workload: Path, fmt: str | None) -> str | None:
    """The trace format of ``workload``, or None for a scenario YAML (the default path: a
    ``.yaml``/``.yml`` name, or any file no trace format recognises that is a YAML mapping)."""
    from gpufence.sim.workloads.trace_formats import FORMATS, TraceFormatError, detect

    if fmt is not None:
        if fmt not in FORMATS:
            raise SpecError(
                [f"--format: unknown format '{fmt}' (known: {', '.join(FORMATS)})"],
                kind="command line",
            )
        return fmt
    if workload.suffix.lower() in (".yaml", ".yml"):
        return None
    if not workload.is_file():
        raise FileNotFoundError(f"'{workload}' not found (a scenario YAML or a trace file)")
    try:
        return detect(workload)
    except TraceFormatError:
        if _yaml_mapping(workload):
            return None
        raise


def _yaml_mapping(path: Path) -> bool:
    import yaml

    try:
        return isinstance(yaml.safe_load(path.read_text()), dict)
    except (yaml.YAMLError, UnicodeDecodeError):
        return False


def load_trace_inputs(
    cluster_path: Path, trace: Path, fmt: str, seed: int | None, slo_p99_ms: float | None
) -> SeedInputs:
    """A trace replayed on its own times: the scenario that frames it, the cluster, the jobs."""
    from gpufence.sim.workloads.trace_formats import load_trace

    if not trace.is_file():
        raise FileNotFoundError(f"trace file '{trace}' not found")
    cluster = load_cluster(cluster_path)
    tw = load_trace(trace, fmt, cluster, slo_p99_ms)
    sc = Scenario(
        name=trace.stem,
        horizon_s=tw.horizon_s,
        seed=seed or 0,
        sample_every_s=max(300.0, tw.horizon_s / 500),
        services=tw.services,
    )
    return SeedInputs(sc, cluster, tw.work, [], note=tw.note)


@dataclass(frozen=True)
class FileInputs:
    """A cluster file and a workload file (a scenario YAML when ``kind`` is None, else a trace
    of that format); called with a seed, that seed's inputs (None: the scenario's own seed)."""

    cluster: Path
    workload: Path
    kind: str | None
    slo_p99_ms: float | None = None  # a request trace's service SLO
    placement: str | None = None  # a fractional placement policy instead of the cluster's

    @classmethod
    def open(
        cls,
        cluster: Path,
        workload: Path,
        fmt: str | None = None,
        slo_p99_ms: float | None = None,
        placement: str | None = None,
    ) -> FileInputs:
        """The files, with the workload's format named (``fmt``) or detected."""
        return cls(cluster, workload, trace_format(workload, fmt), slo_p99_ms, placement)

    def __call__(self, seed: int | None) -> SeedInputs:
        if self.kind is None:
            sc, cluster = load_inputs(self.cluster, self.workload, seed)
            work, events = generate(sc, cluster)
            inputs = SeedInputs(sc, cluster, work, events)
        else:
            inputs = load_trace_inputs(
                self.cluster, self.workload, self.kind, seed, self.slo_p99_ms
            )
        if self.placement is None:
            return inputs
        return replace(inputs, cluster=with_placement(inputs.cluster, self.placement))
