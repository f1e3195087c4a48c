"""Loaders for Alibaba PAI cluster-trace-gpu-v2020 ("MLaaS in the Wild", NSDI'22).

Source: github.com/alibaba/clusterdata ``cluster-trace-gpu-v2020/`` (tables on Aliyun OSS, or the
Git-LFS backup github.com/qzweng/clusterdata-cluster-trace-gpu-v2020-data). Licence CC BY 4.0;
cite Weng et al., "MLaaS in the Wild: Workload Analysis and Scheduling in Large-Scale
Heterogeneous GPU Clusters", NSDI'22.

Format: the upstream CSVs have NO header line (column names live in separate ``*.header`` files
in alibaba/clusterdata's cluster-trace-gpu-v2020); a header line holding the column
names is accepted too. Empty cells are common (tasks that never started or ended, CPU-only tasks
with no ``plan_gpu``). Plain or gzip files.

``load_pai`` — ``pai_job_table`` (job_name, inst_id, user, status, start_time, end_time) joined on
``job_name`` with ``pai_task_table`` (job_name, task_name, inst_num, status, start_time, end_time,
plan_cpu, plan_mem, plan_gpu, gpu_type). Columns used and assumptions:

* one work item per task with ``plan_gpu > 0`` (CPU-only tasks such as parameter servers are
  dropped; a job with several GPU tasks gives several independent items);
* submit = the job's ``start_time`` (the trace's submit time); times are in seconds with a
  constant offset, so by default they are rebased to make the earliest kept submit 0;
* duration = task ``end_time - start_time`` (the queueing before ``start_time`` is what the
  simulator recreates); tasks without both times, or with ``end <= start``, are skipped and
  counted, whatever their ``status``;
* ``plan_gpu`` is per instance in percent of one GPU (50 = half a GPU, 800 = eight GPUs):
  < 100 gives ``GpuRequest.fraction(milli = plan_gpu * 10)``, >= 100 gives
  ``GpuRequest.whole(ceil(plan_gpu / 100))``; an instance needing more GPUs than
  ``gpus_per_node`` is skipped and counted (instances never span machines in PAI);
* ``inst_num`` instances become ``replicas`` of one gang (PAI starts a task's instances
  together);
* ``plan_cpu`` (percent of a core) -> ``cpu_milli = plan_cpu * 10``, ``plan_mem`` (GB) ->
  ``mem_mib = plan_mem * 1024`` when ``host_resources`` is set (empty cells give 0);
* every item is ``WorkloadClass.TRAINING`` although PAI also runs inference jobs (the tables do not
  say which); checkpointability is unknown, so it is a parameter (default False);
* ``gpu_type`` (T4, P100, V100, V100M32, MISC) becomes ``Job.gpu_types`` only with
  ``keep_gpu_type`` (the trace records where the task ran, not a hard constraint).

``load_pai_machines`` — ``pai_machine_spec`` (machine, gpu_type, cap_cpu, cap_mem, cap_gpu): the
machine list and its shape summary (the real file: 1897 machines, 6742 GPUs).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from gpufence.model.job import MILLI_PER_GPU, GpuRequest, Job, WorkloadClass
from gpufence.sim.workloads.demand import LoadStats, parse_count, parse_float, read_csv
from gpufence.sim.workloads.records import WorkItem

JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
TASK_COLUMNS = (
    "job_name",
    "task_name",
    "inst_num",
    "status",
    "start_time",
    "end_time",
    "plan_cpu",
    "plan_mem",
    "plan_gpu",
    "gpu_type",
)
MACHINE_COLUMNS = ("machine", "gpu_type", "cap_cpu", "cap_mem", "cap_gpu")


@dataclass(frozen=True, slots=True)
class _PaiJob:
    submit: float
    user: str


def _read_jobs(path: str | Path, stats: LoadStats) -> dict[str, _PaiJob]:
    jobs: dict[str, _PaiJob] = {}
    for line, row in read_csv(path, ("job_name", "start_time", "user"), names=JOB_COLUMNS):
        name = row["job_name"]
        if not name:
            raise ValueError(f"{path}:{line}: column job_name: empty")
        if name in jobs:
            raise ValueError(f"{path}:{line}: column job_name: duplicate job {name!r}")
        if row["start_time"] == "":
            stats.skip("job_without_submit_time")
            continue
        jobs[name] = _PaiJob(parse_float(path, line, row, "start_time"), row["user"])
    return jobs


class _Task(NamedTuple):
    submit: float
    job_id: str
    request: GpuRequest
    replicas: int
    cpu_milli: int
    mem_mib: int
    gpu_types: tuple[str, ...]
    duration: float


def _request(plan_gpu: float) -> GpuRequest:
    if plan_gpu < 100:
        milli = min(max(round(plan_gpu * MILLI_PER_GPU / 100), 1), MILLI_PER_GPU - 1)
        return GpuRequest.fraction(milli)
    return GpuRequest.whole(math.ceil(plan_gpu / 100 - 1e-9))


def load_pai(
    job_table: str | Path,
    task_table: str | Path,
    gpus_per_node: int = 8,
    *,
    rebase: bool = True,
    checkpointable: bool = False,
    with_estimates: bool = False,
    host_resources: bool = True,
    keep_gpu_type: bool = False,
    queue: str = "",
    stats: LoadStats | None = None,
) -> list[WorkItem]:
    """GPU tasks of the PAI v2020 job + task tables as work items, ordered by submit time.

    ``stats`` (optional) receives the number of task rows read, items kept and rows skipped per
    reason (``no_gpu``, ``unknown_job``, ``no_times``, ``nonpositive_duration``,
    ``no_instances``, ``instance_larger_than_node``, ``job_without_submit_time``).
    """
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    st = stats if stats is not None else LoadStats()
    jobs = _read_jobs(job_table, st)
    path = task_table
    pending: list[_Task] = []
    seen: Counter[str] = Counter()
    for line, row in read_csv(path, TASK_COLUMNS, names=TASK_COLUMNS):
        st.rows += 1
        plan_gpu = parse_float(path, line, row, "plan_gpu", empty=0.0)
        if plan_gpu < 0:
            raise ValueError(f"{path}:{line}: column plan_gpu: negative {plan_gpu}")
        if plan_gpu == 0:
            st.skip("no_gpu")
            continue
        job = jobs.get(row["job_name"])
        if job is None:
            st.skip("unknown_job")
            continue
        if row["start_time"] == "" or row["end_time"] == "":
            st.skip("no_times")
            continue
        start = parse_float(path, line, row, "start_time")
        duration = parse_float(path, line, row, "end_time") - start
        if duration <= 0:
            st.skip("nonpositive_duration")
            continue
        inst_num = parse_count(path, line, row, "inst_num")
        if inst_num < 1:
            st.skip("no_instances")
            continue
        request = _request(plan_gpu)
        if request.gpus > gpus_per_node:
            st.skip("instance_larger_than_node")
            continue
        cpu = parse_float(path, line, row, "plan_cpu", empty=0.0) if host_resources else 0.0
        mem = parse_float(path, line, row, "plan_mem", empty=0.0) if host_resources else 0.0
        if cpu < 0 or mem < 0:
            raise ValueError(f"{path}:{line}: columns plan_cpu/plan_mem: negative value")
        base_id = f"pai-{row['job_name']}-{row['task_name']}"
        seen[base_id] += 1
        job_id = base_id if seen[base_id] == 1 else f"{base_id}#{seen[base_id]}"
        gpu_type = row["gpu_type"]
        types = (gpu_type,) if keep_gpu_type and gpu_type else ()
        pending.append(
            _Task(
                job.submit,
                job_id,
                request,
                inst_num,
                round(cpu * 10),
                round(mem * 1024),
                types,
                duration,
            )
        )
    items = _work_items(pending, rebase, queue, checkpointable, with_estimates)
    st.kept += len(items)
    return items


def _work_items(
    pending: list[_Task], rebase: bool, queue: str, checkpointable: bool, with_estimates: bool
) -> list[WorkItem]:
    """The tasks read, as training jobs in submit order (times from the first when ``rebase``)."""
    origin = min((t.submit for t in pending), default=0.0) if rebase else 0.0
    pending.sort(key=lambda t: (t.submit, t.job_id))
    items = [
        WorkItem(
            Job(
                id=t.job_id,
                workload_class=WorkloadClass.TRAINING,
                request=t.request,
                replicas=t.replicas,
                queue=queue,
                checkpointable=checkpointable,
                est_runtime_s=t.duration if with_estimates else None,
                submit_time=t.submit - origin,
                cpu_milli=t.cpu_milli,
                mem_mib=t.mem_mib,
                gpu_types=t.gpu_types,
            ),
            t.duration,
        )
        for t in pending
    ]
    return items


@dataclass(frozen=True, slots=True)
class PaiMachine:
    machine: str
    gpu_type: str  # T4, P100, V100, V100M32, MISC (older K40m/K80/M60), CPU
    cap_cpu: int
    cap_mem_gb: int
    cap_gpu: int


@dataclass(frozen=True, slots=True)
class PaiMachines:
    """The machine list of ``pai_machine_spec`` with summary counts."""

    machines: tuple[PaiMachine, ...]

    @property
    def n_machines(self) -> int:
        return len(self.machines)

    @property
    def n_gpus(self) -> int:
        return sum(m.cap_gpu for m in self.machines)

    def by_shape(self) -> dict[str, int]:
        """Machines per shape, ``"P100x2"`` style (``"CPU"`` for GPU-less), most common first."""
        shapes = Counter(f"{m.gpu_type}x{m.cap_gpu}" if m.cap_gpu else "CPU" for m in self.machines)
        return dict(sorted(shapes.items(), key=lambda kv: (-kv[1], kv[0])))

    def gpus_by_type(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for m in self.machines:
            if m.cap_gpu:
                out[m.gpu_type] += m.cap_gpu
        return dict(sorted(out.items()))


def load_pai_machines(path: str | Path) -> PaiMachines:
    """Read ``pai_machine_spec`` (header line optional)."""
    machines: list[PaiMachine] = []
    names: set[str] = set()
    for line, row in read_csv(path, MACHINE_COLUMNS, names=MACHINE_COLUMNS):
        if not row["machine"]:
            raise ValueError(f"{path}:{line}: column machine: empty")
        if row["machine"] in names:
            raise ValueError(f"{path}:{line}: column machine: duplicate {row['machine']!r}")
        names.add(row["machine"])
        machines.append(
            PaiMachine(
                row["machine"],
                row["gpu_type"],
                parse_count(path, line, row, "cap_cpu"),
                parse_count(path, line, row, "cap_mem"),
                parse_count(path, line, row, "cap_gpu"),
            )
        )
    return PaiMachines(tuple(machines))
