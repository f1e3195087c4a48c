"""Every measure the control plane exports, defined once: Prometheus name, type, labels, meaning,
and the key of the same measure in the simulator's ``metrics.json`` where it has one.

``control/metrics.py`` and ``control/observe/prom_collectors.py`` build their metric families
from this table (a name, label or help text is never spelled twice), the README's metric table
is checked against it (``tests/unit/test_observability_assets.py``), and the shipped Grafana
dashboard and alert rules (``gpufence/observability``) use only names defined here.

Conventions (Kueue, dcgm-exporter, the Slurm exporter): base units (seconds, bytes, ratios
0..1); counters end in ``_total``; one quantity per metric (capacity, used, lent and borrowed
GPUs are four gauges, never one gauge with a ``kind`` label one must not sum); per-GPU series
carry ``gpu`` (NVML index) and ``uuid`` so DCGM's ``DCGM_FI_*{gpu,UUID}`` join on them; per-queue
gauges are present with 0 for every queue of the spec, so nothing vanishes when a queue is empty.
The job label is ``job_id``, not ``job``: Prometheus sets ``job`` (and ``instance``) on every
scraped series itself and renames a ``job`` label of the target to ``exported_job``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["gauge", "counter", "histogram"]

GPU = ("node", "gpu", "uuid")
MIG = ("node", "gpu", "uuid", "mig")
QUEUE = ("partition", "queue", "class")
DEPLOYMENT = ("deployment", "tenant", "partition")


@dataclass(frozen=True, slots=True)
class Measure:
    name: str  # as exposed (a counter with its _total)
    kind: Kind
    labels: tuple[str, ...]
    help: str
    sim: str | None = None  # the same measure's path in metrics.json, if the simulator has it

    @property
    def base(self) -> str:
        """The name prometheus_client takes (it adds ``_total`` to a counter itself)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


_ALL = (
    # -- build and nodes
    Measure(
        "gpufence_build_info",
        "gauge",
        ("version", "python"),
        "Always 1; its labels say which gpufence and Python serve the API",
    ),
    Measure("gpufence_node_up", "gauge", ("node",), "1 while the node is up, 0 while it is down"),
    # -- jobs and queues (Kueue's ClusterQueue metrics)
    Measure("gpufence_queue_pending_jobs", "gauge", QUEUE, "Jobs waiting in the queue"),
    Measure(
        "gpufence_queue_running_jobs",
        "gauge",
        QUEUE,
        "Jobs of the queue holding GPUs (starting, running or stopping)",
    ),
    Measure(
        "gpufence_queue_admitted_jobs_total", "counter", QUEUE, "Attempts admitted (bound to GPUs)"
    ),
    Measure(
        "gpufence_queue_weighted_share",
        "gauge",
        ("partition", "queue"),
        "Fair-share score: (GPUs held + decayed usage / half-life) / weight; lowest goes first",
    ),
    Measure(
        "gpufence_queue_fair_share_rank",
        "gauge",
        ("partition", "queue"),
        "The queue's place in its partition's fair-share order (1 = tried first)",
    ),
    Measure(
        "gpufence_queue_usage_gpu_seconds",
        "gauge",
        ("partition", "queue"),
        "The queue's decayed past usage in GPU-seconds (its fair-share history)",
    ),
    Measure(
        "gpufence_queue_holding_gpus",
        "gauge",
        ("partition", "queue"),
        "GPU-equivalents the queue's jobs hold now",
    ),
    Measure(
        "gpufence_queue_delay_seconds",
        "histogram",
        QUEUE,
        "Submit (or requeue) to start of each attempt",
        "queue_delay_s",
    ),
    Measure(
        "gpufence_job_state_seconds",
        "histogram",
        ("state", "partition", "class", "queue"),
        "Time a job spent in a state, observed when it leaves it",
    ),
    Measure("gpufence_jobs_submitted_total", "counter", ("class",), "Jobs submitted", "submitted"),
    Measure(
        "gpufence_jobs_rejected_total",
        "counter",
        ("reason",),
        "Jobs rejected at submit, by reason",
        "rejected",
    ),
    Measure(
        "gpufence_jobs_finished_total",
        "counter",
        ("partition", "class", "queue", "outcome"),
        "Jobs that ended: done, failed, cancelled, reclaimed, rejected",
        "states",
    ),
    Measure(
        "gpufence_preemptions_total",
        "counter",
        ("reason",),
        "Checkpointable jobs preempted, by reason",
        "preemptions.count",
    ),
    Measure(
        "gpufence_reclaims_total",
        "counter",
        ("reason",),
        "Capacity taken back (lent, idle), by reason",
        "reclaims.count",
    ),
    Measure("gpufence_stops_total", "counter", ("reason",), "Stops of running jobs, by reason"),
    Measure(
        "gpufence_scheduling_cycle_duration_seconds",
        "histogram",
        (),
        "One reconciler cycle: persist, Scheduler.step, persist, act",
    ),
    Measure(
        "gpufence_gpu_handoff_seconds",
        "histogram",
        (),
        "A GPU's release (exit seen) to the next job's processes spawned on it",
    ),
    # -- partitions (fences)
    Measure("gpufence_partition_capacity_gpus", "gauge", ("partition",), "GPUs of the partition"),
    Measure(
        "gpufence_partition_used_gpus",
        "gauge",
        ("partition",),
        "GPU-equivalents of the partition in use (its own and borrowed work)",
    ),
    Measure(
        "gpufence_partition_lent_gpus",
        "gauge",
        ("partition",),
        "GPUs of the partition lent out to borrowers",
    ),
    Measure(
        "gpufence_partition_borrowed_gpus",
        "gauge",
        ("partition",),
        "GPUs the partition's jobs hold on other partitions' GPUs",
    ),
    Measure(
        "gpufence_partition_allocation_ratio",
        "gauge",
        ("partition",),
        "GPU-equivalents used / capacity",
        "gpu.allocation_ratio",
    ),
    Measure(
        "gpufence_partition_fragmentation_ratio",
        "gauge",
        ("partition",),
        "Free capacity the partition's largest unit cannot use / capacity (FGD)",
        "gpu.fragmentation",
    ),
    Measure(
        "gpufence_largest_placeable_gang_gpus",
        "gauge",
        ("partition",),
        "Whole GPUs the largest single-node gang could get now",
    ),
    Measure(
        "gpufence_partition_preemption_budget",
        "gauge",
        ("partition",),
        "Incident preemptions the partition may make per budget window",
    ),
    Measure(
        "gpufence_partition_preemption_window_seconds",
        "gauge",
        ("partition",),
        "The partition's preemption budget window",
    ),
    Measure(
        "gpufence_partition_preemptions_in_window",
        "gauge",
        ("partition",),
        "Incident preemptions the partition made within its budget window",
    ),
    Measure(
        "gpufence_partition_enforced",
        "gauge",
        ("partition", "sharing"),
        "1 where the partition's sharing is enforced on the device",
    ),
    # -- GPUs (join DCGM on gpu/uuid)
    Measure(
        "gpufence_gpu_allocated",
        "gauge",
        ("node", "gpu", "uuid", "mig", "job_id", "tenant", "partition", "class"),
        "1 while the job holds the GPU (or the MIG instance, or a share of it)",
    ),
    Measure(
        "gpufence_gpu_utilization",
        "gauge",
        GPU,
        "NVML GPU utilisation (0..1), last sample",
        "gpu.utilization",
    ),
    Measure("gpufence_gpu_memory_used_bytes", "gauge", GPU, "NVML memory used, last sample"),
    Measure("gpufence_gpu_memory_total_bytes", "gauge", GPU, "NVML memory total"),
    Measure(
        "gpufence_mig_memory_used_bytes",
        "gauge",
        MIG,
        "NVML memory used by a MIG instance, last sample",
    ),
    Measure(
        "gpufence_gpu_pcie_bytes_per_second",
        "gauge",
        (*GPU, "direction"),
        "NVML PCIe throughput (tx, rx), last sample",
    ),
    Measure(
        "gpufence_gpu_nvlink_bytes_per_second",
        "gauge",
        (*GPU, "direction"),
        "NVML NVLink data throughput over all links (tx, rx), between the last two samples",
    ),
    Measure(
        "gpufence_link_utilization",
        "gauge",
        ("node", "link", "link_class"),
        "Carried traffic / bandwidth of a link: nvlink and pcie per GPU, nic per interface",
        "interconnect",
    ),
    Measure(
        "gpufence_gpu_refused",
        "gauge",
        GPU,
        "1 where gpufence places no work on the GPU (e.g. its MIG mode does not match)",
    ),
    Measure(
        "gpufence_foreign_gpu_processes",
        "gauge",
        GPU,
        "Processes on a GPU that belong to no job holding it, in the last sample",
    ),
    Measure(
        "gpufence_foreign_gpu_process_incidents_total",
        "counter",
        ("gpu",),
        "Processes seen on a GPU that belonged to no job holding it",
    ),
    Measure(
        "gpufence_mig_reconfigures_total",
        "counter",
        ("result",),
        "MIG re-partitions carried out, by result (ok, failed)",
    ),
    Measure(
        "gpufence_mps_daemon_restarts_total",
        "counter",
        ("gpu",),
        "MPS control daemons restarted after dying",
    ),
    # -- node I/O (this machine's NICs and the data dir's disk)
    Measure(
        "gpufence_node_network_bytes_per_second",
        "gauge",
        ("node", "device", "direction"),
        "NIC throughput from /sys/class/net (tx, rx), between the last two samples",
    ),
    Measure(
        "gpufence_node_storage_await_seconds",
        "gauge",
        ("node", "device"),
        "Mean wait of the data dir device's I/Os (iostat's await) between the last two samples",
    ),
    Measure(
        "gpufence_node_storage_busy_ratio",
        "gauge",
        ("node", "device"),
        "Share of time the data dir device was busy (iostat's %util / 100)",
    ),
    # -- serving deployments
    Measure(
        "gpufence_serving_p99_seconds",
        "gauge",
        DEPLOYMENT,
        "p99 latency of the deployment's requests over the sliding window",
        "serving.p99_ms",
    ),
    Measure(
        "gpufence_serving_slo_seconds",
        "gauge",
        DEPLOYMENT,
        "The deployment's declared p99 SLO",
        "serving.slo_ms",
    ),
    Measure(
        "gpufence_serving_slo_attainment",
        "gauge",
        DEPLOYMENT,
        "Request-weighted share of scoring windows whose p99 met the SLO",
        "serving.slo_attainment",
    ),
    Measure(
        "gpufence_serving_requests_total",
        "counter",
        DEPLOYMENT,
        "Requests the deployment's replicas reported",
    ),
    Measure(
        "gpufence_serving_slow_requests_total",
        "counter",
        DEPLOYMENT,
        "Requests slower than the SLO",
    ),
    Measure(
        "gpufence_serving_replicas", "gauge", DEPLOYMENT, "Replicas of the deployment holding GPUs"
    ),
    Measure(
        "gpufence_serving_latency_source_up",
        "gauge",
        ("deployment", "tenant", "job_id"),
        "1 where the replica's last latency scrape succeeded",
    ),
)

MEASURES: dict[str, Measure] = {m.name: m for m in _ALL}


def measure(name: str) -> Measure:
    """The definition of an exported measure (KeyError names it: a typo fails at import)."""
    return MEASURES[name]
