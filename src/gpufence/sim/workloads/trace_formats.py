"""``gpufence sim CLUSTER TRACE``: which public trace a file is, and the workload it replays.

Every workload loader in ``sim/workloads`` is one format here, an entry of ``LOADERS``
(``--format``, or detected):

  philly     Microsoft Philly ``cluster_job_log`` (JSON): training jobs on their submit times
  pai        Alibaba PAI v2020 ``pai_task_table`` with its ``pai_job_table`` beside it (the
             same name with ``job_table`` for ``task_table``; either file may be given): GPU
             tasks as training gangs on their jobs' submit times
  tiresias   Tiresias simulator job CSV: checkpointable training gangs
  openb      Alibaba v2023 openb pod list: pods on their creation/deletion times
  dlrm       Alibaba v2025 DLRM instances: each GPU replica a serving job alive from its
             creation to its deletion (or to the end, when it outlives the window)
  azure-llm  Azure LLM inference 2023 requests: the request-rate curve of one service,
             autoscaled inside the cluster's first partition that admits serving
  sd         Alibaba v2026 Stable Diffusion (LoRA) requests: likewise

Detection without ``--format`` reads the start of the file (plain or gzip): a JSON list whose
jobs carry ``submitted_time`` and ``attempts`` is Philly; a CSV is known by its header's columns
(each loader's required columns), or, for the PAI tables that upstream ship without a header, by
a first row of the task (10) or job (6) table's width whose time columns are numbers.

The replay runs over the trace's own span: job traces until their last job would have ended
without queueing (+ 1 s), DLRM until its last creation or deletion (+ 1 s), request traces over
their rate curve. Work still queued then is reported as pending, as in any sim run. Loaders that
need a node size (PAI, Tiresias) get the cluster's largest node.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from gpufence.model.cluster import Cluster
from gpufence.model.job import GpuRequest, Job, WorkloadClass
from gpufence.sim.scenario import Demand, Service
from gpufence.sim.workloads import pai, philly, serving_traces, tiresias
from gpufence.sim.workloads.demand import LoadStats, RequestDemand, open_trace
from gpufence.sim.workloads.openb import POD_COLUMNS
from gpufence.sim.workloads.openb_replay import openb_replay
from gpufence.sim.workloads.records import WorkItem

SLO_TIMES_MEAN_SERVICE = 10.0
"""Default p99 SLO of a request trace's service: ten times its mean service time (the p99 of
an exponential service time alone is 4.6 x its mean; the rest is room for queueing)."""
SERVING_PRIORITY = 100  # as a scenario service's replicas (``Service.priority``)
_SNIFF_CHARS = 1 << 16


class TraceFormatError(ValueError):
    """The file is no trace format gpufence knows; the message names the file and the formats."""


@dataclass
class TraceWorkload:
    """What a trace replays: jobs on their own times and/or autoscaled services."""

    format: str
    horizon_s: float
    work: list[WorkItem] = field(default_factory=list)
    services: list[Service] = field(default_factory=list)
    note: str = ""
    """One line for the console: what was read and what was left out."""


# ---------------------------------------------------------------------- detection
def detect(path: Path) -> str:
    """The format of ``path`` by its content; ``TraceFormatError`` when none fits."""
    try:
        with open_trace(path) as f:
            head = f.read(_SNIFF_CHARS)
    except UnicodeDecodeError:
        head = ""
    text = head.lstrip()
    if text.startswith("["):
        if '"submitted_time"' in text and '"attempts"' in text:
            return "philly"
    elif text:
        first = next(csv.reader(io.StringIO(text)), [])
        cells = {c.strip() for c in first}
        by_header = (
            ("openb", POD_COLUMNS),
            ("tiresias", tiresias.REQUIRED),
            ("azure-llm", serving_traces.AZURE_COLUMNS),
            ("sd", serving_traces.SD_COLUMNS),
            ("dlrm", serving_traces.DLRM_COLUMNS),
            ("pai", pai.TASK_COLUMNS),
            ("pai", pai.JOB_COLUMNS),
        )
        for name, columns in by_header:
            if set(columns) <= cells:
                return name
        if _headerless_pai(first):
            return "pai"
    raise TraceFormatError(
        f"{path}: not a trace format gpufence knows ({', '.join(FORMATS)}) nor a scenario YAML; "
        "name its format with --format"
    )


def _number_or_empty(cell: str) -> bool:
    try:
        float(cell) if cell.strip() else 0.0
    except ValueError:
        return False
    return True


def _headerless_pai(row: list[str]) -> bool:
    """A first data row of the task table (times in columns 4-5, inst_num in 2, plan_cpu,
    plan_mem and plan_gpu in 6-8) or of the job table (times in 4-5)."""
    if len(row) == len(pai.TASK_COLUMNS):
        return all(_number_or_empty(row[i]) for i in (2, 4, 5, 6, 7, 8)) and bool(row[2].strip())
    if len(row) == len(pai.JOB_COLUMNS):
        return all(_number_or_empty(row[i]) for i in (4, 5)) and not _number_or_empty(row[3])
    return False


# ---------------------------------------------------------------------- loading
def load_trace(
    path: Path, fmt: str, cluster: Cluster, slo_p99_ms: float | None = None
) -> TraceWorkload:
    """The workload of trace ``path`` in format ``fmt`` (one of ``FORMATS``) on ``cluster``;
    ``slo_p99_ms`` is the request traces' service SLO (default: see SLO_TIMES_MEAN_SERVICE)."""
    loader = LOADERS.get(fmt)
    if loader is None:
        raise TraceFormatError(f"--format: unknown format '{fmt}' (known: {', '.join(FORMATS)})")
    return loader(path, cluster, slo_p99_ms)


def _gpus_per_node(cluster: Cluster) -> int:
    """The node size of the loaders that split a job into gangs: the cluster's largest node."""
    return max(len(n.gpu_ids) for n in cluster.nodes)


def _jobs(path: Path, fmt: str, work: list[WorkItem], stats: LoadStats) -> TraceWorkload:
    """A job trace's workload: its jobs on their own times, over their span (+ 1 s)."""
    if not work:
        raise ValueError(f"{path}: no job of this {fmt} trace can be replayed ({_skips(stats)})")
    horizon = max(w.job.submit_time + w.duration_s for w in work) + 1.0
    note = f"{fmt} replay: {len(work)} jobs ({_skips(stats)})"
    return TraceWorkload(fmt, horizon, work=work, note=note)


def _philly(path: Path, cluster: Cluster, slo_p99_ms: float | None) -> TraceWorkload:
    stats = LoadStats()
    return _jobs(path, "philly", philly.load_philly_jobs(path, stats=stats), stats)


def _pai(path: Path, cluster: Cluster, slo_p99_ms: float | None) -> TraceWorkload:
    stats = LoadStats()
    jobs, tasks = _pai_tables(path)
    work = pai.load_pai(jobs, tasks, _gpus_per_node(cluster), stats=stats)
    return _jobs(path, "pai", work, stats)


def _tiresias(path: Path, cluster: Cluster, slo_p99_ms: float | None) -> TraceWorkload:
    work = tiresias.load_tiresias(path, _gpus_per_node(cluster))
    return _jobs(path, "tiresias", work, LoadStats())  # the loader skips nothing


def _openb(path: Path, cluster: Cluster, slo_p99_ms: float | None) -> TraceWorkload:
    replay = openb_replay(path, cluster)
    note = f"openb replay: {len(replay.work)} pods ({replay.skipped} CPU-only pods left out)"
    return TraceWorkload("openb", replay.horizon_s, work=replay.work, note=note)


def _skips(stats: LoadStats) -> str:
    if not stats.skipped:
        return "none left out"
    parts = ", ".join(f"{n} {why}" for why, n in sorted(stats.skipped.items()))
    return f"left out: {parts}"


def _pai_tables(path: Path) -> tuple[Path, Path]:
    """(job table, task table) from either one of them."""
    name = path.name
    if "task_table" in name:
        return path.with_name(name.replace("task_table", "job_table")), path
    if "job_table" in name:
        return path, path.with_name(name.replace("job_table", "task_table"))
    raise ValueError(
        f"{path}: a PAI trace is two tables; give the pai_task_table file with its "
        "pai_job_table beside it (file names that differ only in task_table/job_table)"
    )


def _dlrm(path: Path, cluster: Cluster, slo_p99_ms: float | None) -> TraceWorkload:
    gpu = [i for i in serving_traces.read_dlrm_instances(path) if i.gpu_request > 0]
    if not gpu:
        raise ValueError(f"{path}: no GPU replicas (gpu_request > 0)")
    finite = [t for i in gpu for t in (i.creation_s, i.deletion_s) if math.isfinite(t)]
    end = max(finite, default=0.0)
    if end <= 0.0:
        raise ValueError(f"{path}: no creation or deletion time: the trace's window is unknown")
    horizon = end + 1.0
    work = [
        WorkItem(
            Job(
                f"dlrm-{i.instance_sn}",
                WorkloadClass.SERVING,
                GpuRequest.whole(i.gpu_request),
                priority=SERVING_PRIORITY,
                submit_time=i.creation_s,
            ),
            max(1.0, min(i.deletion_s, horizon) - i.creation_s),
            ack_after_s=None,  # serving replicas never checkpoint
        )
        for i in sorted(gpu, key=lambda i: (i.creation_s, i.instance_sn))
    ]
    apps = len({i.app_name for i in gpu})
    note = f"dlrm replay: {len(work)} GPU replicas of {apps} apps (CPU-node instances left out)"
    return TraceWorkload("dlrm", horizon, work=work, note=note)


def _request_trace(
    fmt: str, path: Path, cluster: Cluster, slo_p99_ms: float | None
) -> TraceWorkload:
    fence = next(
        (n for n, p in cluster.partitions.items() if WorkloadClass.SERVING in p.admits), None
    )
    if fence is None:
        raise ValueError(
            f"{path}: a {fmt} trace is serving demand, but no partition of {cluster.name} "
            "admits serving"
        )
    demand = Demand(trace=f"{fmt}:{path}")
    curve: RequestDemand = _REQUEST_CURVES[fmt](path, demand.bin_s)
    service_ms = curve.service_s_mean * 1000.0
    if service_ms <= 0:
        raise ValueError(f"{path}: no request with a service time: nothing to serve")
    slo = slo_p99_ms if slo_p99_ms is not None else SLO_TIMES_MEAN_SERVICE * service_ms
    svc = Service(
        name=curve.name,
        partition=fence,
        slo_p99_ms=slo,
        service_ms=service_ms,
        service_cv=curve.service_s_cv,
        min_replicas=1,
        max_replicas=max(1, len(cluster.partition_gpus[fence])),
        priority=SERVING_PRIORITY,
        demand=demand,
    )
    note = (
        f"{fmt} trace: {curve.total_requests():,.0f} requests over {curve.duration_s:,.0f} s, "
        f"mean service {service_ms:,.0f} ms, p99 SLO {slo:,.0f} ms, served in '{fence}'"
    )
    return TraceWorkload(fmt, curve.duration_s, services=[svc], note=note)


Loader = Callable[[Path, Cluster, float | None], TraceWorkload]
"""A format's loader: (the file, the cluster it replays on, a request trace's p99 SLO in ms)."""

# a request trace's rate curve: (the file, the bin width in s)
_REQUEST_CURVES: dict[str, Callable[[Path, float], RequestDemand]] = {
    "azure-llm": serving_traces.load_azure_llm,
    "sd": serving_traces.load_sd_requests,
}

# Every format ``--format`` names, in the order messages list them; a new format is one entry
# here (and, to be detected without ``--format``, its columns in ``detect``).
LOADERS: dict[str, Loader] = {
    "philly": _philly,
    "pai": _pai,
    "tiresias": _tiresias,
    "dlrm": _dlrm,
    "openb": _openb,
    "azure-llm": partial(_request_trace, "azure-llm"),
    "sd": partial(_request_trace, "sd"),
}
FORMATS = tuple(LOADERS)
