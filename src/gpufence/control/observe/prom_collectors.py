"""The gauges of ``/metrics`` read at scrape time: partitions, queues, GPUs, nodes, serving
deployments, this machine's I/O, build info.

Names, labels and help come from ``gpufence.telemetry.measures`` (each family is built from its
measure, and each sample's labels are given by name, so their order is the measure's). The live
scheduler state is read once per scrape on the reconciler thread (``live_view.gauges``); the
serving figures from the observatory's latency book; the NIC and disk rates from the GPU
sampler's last pass. A family with nothing to report is still declared (``# HELP``/``# TYPE``),
and per-queue gauges are 0 for every queue of the spec.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufence import __version__
from gpufence.control.observe.observatory import Observatory
from gpufence.telemetry.capacity import allocation_ratio
from gpufence.telemetry.measures import Measure, measure


class _Families:
    """The families of one scrape, by measure name; samples added with labels by name."""

    def __init__(self) -> None:
        self.by_name: dict[str, Metric] = {}

    def add(self, name: str, labels: Mapping[str, object], value: float) -> None:
        fam = self.by_name.get(name)
        m = measure(name)
        if fam is None:
            fam = self.by_name[name] = _family(m)
        fam.add_metric([str(labels[k]) for k in m.labels], float(value))  # type: ignore[attr-defined]

    def declare(self, *names: str) -> None:
        for n in names:
            self.by_name.setdefault(n, _family(measure(n)))


def _family(m: Measure) -> Metric:
    if m.kind == "counter":
        return CounterMetricFamily(m.base, m.help, labels=list(m.labels))
    return GaugeMetricFamily(m.name, m.help, labels=list(m.labels))


_PARTITION = (
    ("gpufence_partition_capacity_gpus", "capacity_gpus"),
    ("gpufence_partition_used_gpus", "used_gpus"),
    ("gpufence_partition_lent_gpus", "lent_gpus"),
    ("gpufence_partition_borrowed_gpus", "borrowed_gpus"),
    ("gpufence_largest_placeable_gang_gpus", "largest_gang"),
    ("gpufence_partition_fragmentation_ratio", "fragmentation"),
    ("gpufence_partition_preemption_budget", "preemption_budget"),
    ("gpufence_partition_preemption_window_seconds", "preemption_window_s"),
    ("gpufence_partition_preemptions_in_window", "preemptions_in_window"),
)
_GPU = (
    ("gpufence_gpu_utilization", "utilization"),
    ("gpufence_gpu_memory_used_bytes", "memory_used_bytes"),
    ("gpufence_gpu_memory_total_bytes", "memory_total_bytes"),
)
LIVE = (
    *(n for n, _ in _PARTITION),
    "gpufence_partition_allocation_ratio",
    "gpufence_partition_enforced",
    "gpufence_node_up",
    "gpufence_queue_pending_jobs",
    "gpufence_queue_running_jobs",
    "gpufence_queue_weighted_share",
    "gpufence_queue_fair_share_rank",
    "gpufence_queue_usage_gpu_seconds",
    "gpufence_queue_holding_gpus",
    "gpufence_gpu_allocated",
    *(n for n, _ in _GPU),
    "gpufence_mig_memory_used_bytes",
    "gpufence_gpu_pcie_bytes_per_second",
    "gpufence_gpu_nvlink_bytes_per_second",
    "gpufence_link_utilization",
    "gpufence_gpu_refused",
    "gpufence_foreign_gpu_processes",
)
SERVING = (
    "gpufence_serving_p99_seconds",
    "gpufence_serving_slo_seconds",
    "gpufence_serving_slo_attainment",
    "gpufence_serving_requests_total",
    "gpufence_serving_slow_requests_total",
    "gpufence_serving_replicas",
    "gpufence_serving_latency_source_up",
)
HOST = (
    "gpufence_node_network_bytes_per_second",
    "gpufence_node_storage_await_seconds",
    "gpufence_node_storage_busy_ratio",
)


def _partitions(f: _Families, data: dict[str, Any]) -> None:
    for p in data["partitions"]:
        lab = {"partition": p["name"]}
        for name, key in _PARTITION:
            if key in p:
                f.add(name, lab, p[key])
        f.add(
            "gpufence_partition_allocation_ratio",
            lab,
            allocation_ratio(p["used_gpus"], p["capacity_gpus"]),
        )
        if "enforced" in p:
            f.add("gpufence_partition_enforced", {**lab, "sharing": p["sharing"]}, p["enforced"])
    for name, up in data["nodes"]:
        f.add("gpufence_node_up", {"node": name}, 1.0 if up else 0.0)
    for q in data["queues"]:
        f.add("gpufence_queue_pending_jobs", q, q["pending"])
        f.add("gpufence_queue_running_jobs", q, q["running"])
    for q in data["fair_share"]:
        f.add("gpufence_queue_weighted_share", q, q["share"])
        f.add("gpufence_queue_fair_share_rank", q, q["rank"])
        f.add("gpufence_queue_usage_gpu_seconds", q, q["usage_gpu_s"])
        f.add("gpufence_queue_holding_gpus", q, q["holding_gpus"])
    for a in data["allocations"]:
        f.add("gpufence_gpu_allocated", a, 1.0)


def _gpus(f: _Families, data: dict[str, Any]) -> None:
    for g in data["gpus"]:
        lab = {"node": g["node"], "gpu": g["index"], "uuid": g["uuid"]}
        for name, key in _GPU:
            if g.get(key) is not None:
                f.add(name, lab, g[key])
        for m in g.get("mig_memory") or ():
            f.add("gpufence_mig_memory_used_bytes", {**lab, "mig": m["uuid"]}, m["used_bytes"])
        for kind in ("pcie", "nvlink"):
            for d in ("tx", "rx"):
                v = g.get(f"{kind}_{d}_bytes_s")
                if v is not None:
                    f.add(f"gpufence_gpu_{kind}_bytes_per_second", {**lab, "direction": d}, v)
            u = g.get(f"{kind}_utilization")
            if u is not None:
                link = {"node": g["node"], "link": f"gpu{g['index']}", "link_class": kind}
                f.add("gpufence_link_utilization", link, u)
        f.add("gpufence_gpu_refused", lab, 1.0 if g.get("refused") else 0.0)
        f.add("gpufence_foreign_gpu_processes", lab, len(g.get("foreign", [])))


def _serving(f: _Families, obs: Observatory) -> None:
    deps = obs.state.deployments
    for s in obs.book.summaries():
        lab = {"deployment": s.key.name, "tenant": s.key.tenant, "partition": s.partition}
        if s.p99_s is not None:
            f.add("gpufence_serving_p99_seconds", lab, s.p99_s)
        if s.slo_s is not None:
            f.add("gpufence_serving_slo_seconds", lab, s.slo_s)
        if s.attainment is not None:
            f.add("gpufence_serving_slo_attainment", lab, s.attainment)
        f.add("gpufence_serving_requests_total", lab, s.requests_total)
        f.add("gpufence_serving_slow_requests_total", lab, s.slow_total)
    for key, d in deps.items():
        lab = {"deployment": key.name, "tenant": key.tenant, "partition": d.partition}
        f.add("gpufence_serving_replicas", lab, d.replicas)
    by_job = {src.job_id: src.key for src in obs.state.sources}
    for jid, (up, _err) in sorted(obs.scraper.status.items()):
        src_key = by_job.get(jid)
        if src_key is not None:
            lab = {"deployment": src_key.name, "tenant": src_key.tenant, "job_id": jid}
            f.add("gpufence_serving_latency_source_up", lab, 1.0 if up else 0.0)


def _host(f: _Families, obs: Observatory) -> None:
    node = obs.cluster.nodes[0].name
    h = obs.host.latest()
    for n in h.nics:
        for d, v in (("tx", n.tx_bytes_s), ("rx", n.rx_bytes_s)):
            lab = {"node": node, "device": n.device, "direction": d}
            f.add("gpufence_node_network_bytes_per_second", lab, v)
        if n.utilization is not None:
            link = {"node": node, "link": n.device, "link_class": "nic"}
            f.add("gpufence_link_utilization", link, n.utilization)
    if h.disk is not None:
        lab = {"node": node, "device": h.disk.device}
        if h.disk.await_s is not None:
            f.add("gpufence_node_storage_await_seconds", lab, h.disk.await_s)
        f.add("gpufence_node_storage_busy_ratio", lab, h.disk.busy)


class LiveCollector(Collector):
    """See the module docstring; ``read`` returns ``live_view.gauges`` (None before start)."""

    def __init__(
        self, read: Callable[[], dict[str, Any] | None], observatory: Observatory | None
    ) -> None:
        self._read = read
        self._obs = observatory

    def collect(self) -> Iterator[Metric]:
        f = _Families()
        f.add(
            "gpufence_build_info", {"version": __version__, "python": platform.python_version()}, 1
        )
        data = self._read()
        if data is not None:
            f.declare(*LIVE)
            _partitions(f, data)
            _gpus(f, data)
        if self._obs is not None:
            f.declare(*SERVING, *HOST)
            _serving(f, self._obs)
            _host(f, self._obs)
        yield from f.by_name.values()
