"""Fluent builders for tests: ``job("a").gang(4, gpus=8).queue("q").build()``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpufence.model.cluster import Cluster
from gpufence.model.hardware import Fabric, Gpu, GpuType, Node
from gpufence.model.job import AfterKind, GpuRequest, Job, WorkloadClass
from gpufence.model.partition import (
    LendingRule,
    MigConfig,
    Partition,
    PreemptionMode,
    PreemptionPolicy,
    QueueSpec,
    ReclaimPolicy,
    SharingMode,
)

H100 = GpuType("H100-80GB", 80.0, mig_model="H100-80GB")
A100_40 = GpuType("A100-40GB", 40.0, mig_model="A100-40GB")
ALL = frozenset(WorkloadClass)
_Sel = tuple[str, int | None, tuple[int, ...] | None]


class ClusterBuilder:
    def __init__(self, name: str = "test") -> None:
        self.name = name
        self._groups: list[tuple[str, int, int, str, str, tuple[int, ...], int, int]] = []
        self._parts: list[
            tuple[Partition, list[tuple[str, int | None, tuple[int, ...] | None]]]
        ] = []
        self._queues: list[QueueSpec] = []
        self._types: dict[str, GpuType] = {"H100-80GB": H100, "A100-40GB": A100_40}

    def nodes(
        self,
        group: str,
        count: int,
        gpus: int = 8,
        rack: str = "r0",
        gpu_type: str = "H100-80GB",
        nvlink: tuple[int, ...] | None = None,
        cpu_cores: int = 64,
        mem_gib: int = 512,
    ) -> ClusterBuilder:
        self._groups.append(
            (group, count, gpus, rack, gpu_type, nvlink or (gpus,), cpu_cores, mem_gib)
        )
        return self

    def partition(
        self,
        name: str,
        groups: list[str] | None = None,
        gpus: list[tuple[str, int, tuple[int, ...]]] | None = None,
        admits: frozenset[WorkloadClass] = ALL,
        **kw: Any,
    ) -> ClusterBuilder:
        sel: list[tuple[str, int | None, tuple[int, ...] | None]] = [
            (g, None, None) for g in (groups or [])
        ]
        sel += [(g, i, idx) for g, i, idx in (gpus or [])]
        self._parts.append((Partition(name=name, admits=admits, **kw), sel))
        return self

    def queue(self, name: str, partition: str, **kw: Any) -> ClusterBuilder:
        self._queues.append(QueueSpec(name=name, partition=partition, **kw))
        return self

    def build(self) -> Cluster:
        nodes: list[Node] = []
        gpus: list[Gpu] = []
        owner: dict[tuple[str, int, int], str] = {}
        for part, sels in self._parts:
            for group, idx, gidx in sels:
                g = next(x for x in self._groups if x[0] == group)
                for i in range(g[1]) if idx is None else [idx]:
                    for k in range(g[2]) if gidx is None else gidx:
                        owner[(group, i, k)] = part.name
        for group, count, per, rack, gtype, nvlink, cores, mem in self._groups:
            for i in range(count):
                base = len(gpus)
                domains: list[tuple[int, ...]] = []
                at = 0
                for size in nvlink:
                    domains.append(tuple(range(at, at + size)))
                    at += size
                idx = len(nodes)
                for k in range(per):
                    dom = next(d for d, ks in enumerate(domains) if k in ks)
                    gpus.append(Gpu(base + k, idx, k, gtype, dom, owner[(group, i, k)]))
                nodes.append(
                    Node(
                        idx,
                        f"{group}-{i}",
                        group,
                        rack,
                        tuple(range(base, base + per)),
                        gtype,
                        cores * 1000,
                        mem * 1024,
                        tuple(domains),
                    )
                )
        queues = {q.name: q for q in self._queues}
        for part, _ in self._parts:
            if not any(q.partition == part.name for q in self._queues):
                queues[part.name] = QueueSpec(part.name, part.name)
        return Cluster(
            name=self.name,
            gpu_types=dict(self._types),
            nodes=tuple(nodes),
            gpus=tuple(gpus),
            partitions={p.name: p for p, _ in self._parts},
            queues=queues,
            fabric=Fabric(),
        )


class JobBuilder:
    def __init__(self, job_id: str) -> None:
        self._job = Job(job_id)

    def gang(self, replicas: int, gpus: int = 1) -> JobBuilder:
        self._job = replace(self._job, replicas=replicas, request=GpuRequest.whole(gpus))
        return self

    def gpus(self, n: int) -> JobBuilder:
        return self.gang(1, n)

    def mig(self, profile: str, replicas: int = 1) -> JobBuilder:
        self._job = replace(self._job, request=GpuRequest.mig(profile), replicas=replicas)
        return self

    def fraction(self, milli: int, mem_mib: int = 0) -> JobBuilder:
        self._job = replace(self._job, request=GpuRequest.fraction(milli, mem_mib))
        return self

    def cls(self, c: WorkloadClass | str) -> JobBuilder:
        self._job = replace(self._job, workload_class=WorkloadClass(c))
        return self

    def queue(self, q: str) -> JobBuilder:
        self._job = replace(self._job, queue=q)
        return self

    def partition(self, p: str) -> JobBuilder:
        self._job = replace(self._job, partition=p)
        return self

    def tenant(self, t: str) -> JobBuilder:
        self._job = replace(self._job, tenant=t)
        return self

    def priority(self, p: int) -> JobBuilder:
        self._job = replace(self._job, priority=p)
        return self

    def checkpointable(self, flag: bool = True) -> JobBuilder:
        self._job = replace(self._job, checkpointable=flag)
        return self

    def est(self, seconds: float) -> JobBuilder:
        self._job = replace(self._job, est_runtime_s=seconds)
        return self

    def limit(self, seconds: float) -> JobBuilder:
        """A hard time limit per attempt (``Job.time_limit_s``)."""
        self._job = replace(self._job, time_limit_s=seconds)
        return self

    def cpu(self, milli: int, mem_mib: int = 0) -> JobBuilder:
        self._job = replace(self._job, cpu_milli=milli, mem_mib=mem_mib)
        return self

    def types(self, *names: str) -> JobBuilder:
        self._job = replace(self._job, gpu_types=tuple(names))
        return self

    def at(self, t: float) -> JobBuilder:
        self._job = replace(self._job, submit_time=t)
        return self

    def after(self, kind: AfterKind | str, *parents: str) -> JobBuilder:
        deps = tuple((AfterKind(kind), p) for p in parents)
        self._job = replace(self._job, after=self._job.after + deps)
        return self

    def held(self, flag: bool = True) -> JobBuilder:
        self._job = replace(self._job, held=flag)
        return self

    def array(self, group: str, cap: int = 0) -> JobBuilder:
        self._job = replace(self._job, array_group=group, array_cap=cap)
        return self

    def build(self) -> Job:
        return self._job


def job(job_id: str) -> JobBuilder:
    return JobBuilder(job_id)


__all__ = [
    "ALL",
    "ClusterBuilder",
    "JobBuilder",
    "LendingRule",
    "MigConfig",
    "PreemptionMode",
    "PreemptionPolicy",
    "ReclaimPolicy",
    "SharingMode",
    "job",
]
