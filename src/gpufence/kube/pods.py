"""Pods -> the core's jobs: one pod is a job, a gang of pods is one job of N replicas.

Everything a pod asks for is read from its containers' resources and its ``gpufence.io/``
labels and annotations (kube/names.py). A value that cannot be read is a ``PodProblem`` naming
the key and the fix: the front end shows it on the pod (condition reason ``gpufence/Rejected``)
and leaves the pod alone until the user fixes or deletes it -- it never guesses.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal

from gpufence.kube import names
from gpufence.kube.node_rules import GpuNodeFacts, gpu_types_for
from gpufence.kube.objects import ObservedPod
from gpufence.model.job import MILLI_PER_GPU, GpuRequest, Job, WorkloadClass
from gpufence.model.partition import QueueSpec

_TRUE = {"true": True, "false": False}
# a gang's name becomes part of a job id ("ns/@name"): Kubernetes' own name rule (a DNS label,
# dots allowed), so that nothing in it ('/', '#', '@', spaces) can read as another id
_GANG_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class PodProblem:
    pod: str  # namespace/name
    message: str


@dataclass(frozen=True, slots=True)
class PodAsk:
    """One pod's reading: the job it would be on its own, and its gang (name, size) if any."""

    pod: ObservedPod
    job: Job
    gang: tuple[str, int] | None


def job_id_of(pod: ObservedPod) -> str:
    """A gang's pods share one job id; pod names cannot hold '@', so the two never collide."""
    gang = pod.group or pod.annotations.get(names.ANN_GANG_NAME)
    return f"{pod.namespace}/@{gang}" if gang else pod.key


def shown(raw: str, limit: int = 80) -> str:
    """A value a user wrote, quoted for a message: cut, as the message lands on the pod (a
    condition, an Event) and in the log, and an annotation may hold 256 KiB."""
    return repr(raw) if len(raw) <= limit else f"{raw[:limit]!r}... ({len(raw)} characters)"


def _number(pod: ObservedPod, key: str, parse: Callable[[str], float]) -> float | None:
    raw = pod.annotations.get(key)
    if raw is None:
        return None
    try:
        value = parse(raw.strip())
    except (ValueError, OverflowError):  # (an integer of 309+ digits is no float)
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"annotation {key}: {shown(raw)} is not {names.USER_ANNOTATIONS[key]}")
    return value


def _positive(pod: ObservedPod, key: str) -> float | None:
    value = _number(pod, key, float)
    if value is not None and value <= 0:
        raise ValueError(f"annotation {key}: {value:g} is not {names.USER_ANNOTATIONS[key]}")
    return value


# the core names a job's fields; on a pod the user wrote these (intake.invalid's messages)
_CORE_FIELDS = {
    "est_runtime_s": names.ANN_EST_RUNTIME,
    "time_limit_s": names.ANN_TIME_LIMIT,
    "priority": names.ANN_PRIORITY,
    "gpu_mem_mib": names.ANN_GPU_MEMORY,
}


def in_pod_terms(message: str) -> str:
    """A refusal of the core in the words of the pod: the annotation for the job field a
    "<field> must be ..." message names, the label for the CLI's --queue."""
    message = message.replace("--queue", f"the label {names.LABEL_QUEUE}")
    for field, key in _CORE_FIELDS.items():
        message = re.sub(rf"\b{field} must be\b", f"annotation {key} must be", message)
    return message


def changeable(pod: ObservedPod) -> tuple[int, float | None]:
    """The fields of a pod's job that may change while it waits or runs (``JobUpdated``):
    its priority and time limit annotations (``ValueError`` naming an unreadable one)."""
    priority = _number(pod, names.ANN_PRIORITY, _integer) or 0
    return int(priority), _positive(pod, names.ANN_TIME_LIMIT)


def _integer(text: str) -> float:
    if not text.lstrip("-").isascii() or not text.lstrip("-").isdigit():
        raise ValueError(text)
    return float(int(text))


def _gpu_request(pod: ObservedPod) -> GpuRequest:
    req = pod.requests
    mig = {
        k.removeprefix(names.RES_MIG_PREFIX): v
        for k, v in req.items()
        if k.startswith(names.RES_MIG_PREFIX) and v > 0
    }
    whole = req.get(names.RES_GPU, Decimal(0))
    if pod.claims:  # DRA: the GPUs its ResourceClaims ask for (kube/dra.py read them)
        if isinstance(pod.claim_gpus, str) or pod.claim_gpus <= 0:
            raise ValueError(pod.claim_gpus or "its ResourceClaims are not read yet")
        if whole or mig:
            raise ValueError(
                "ask for GPUs one way: spec.resourceClaims or nvidia.com/gpu / nvidia.com/mig-*"
            )
        if pod.claim_mig:
            return GpuRequest.mig(pod.claim_mig)
        return GpuRequest.whole(pod.claim_gpus)
    fraction = _number(pod, names.ANN_GPU_FRACTION, float)
    if mig and (whole or len(mig) > 1 or fraction is not None):
        raise ValueError(
            "ask for one kind of GPU: nvidia.com/gpu or a single nvidia.com/mig-* resource"
        )
    if mig:
        ((profile, count),) = mig.items()
        if count != 1:
            raise ValueError(
                f"nvidia.com/mig-{profile}: {count} -- a pod takes one MIG instance (use a "
                "gang for more)"
            )
        return GpuRequest.mig(profile)
    if fraction is not None:
        if not 0 < fraction < 1 or whole not in (0, 1):
            raise ValueError(
                f"annotation {names.ANN_GPU_FRACTION}: {fraction:g} with nvidia.com/gpu: "
                f"{whole} -- give 0 < f < 1 with nvidia.com/gpu: 1 (or none)"
            )
        mem = _number(pod, names.ANN_GPU_MEMORY, _integer) or 0
        if mem < 0:
            raise ValueError(f"annotation {names.ANN_GPU_MEMORY}: must be >= 0")
        return GpuRequest.fraction(max(1, round(fraction * MILLI_PER_GPU)), int(mem))
    if whole != int(whole) or whole <= 0:
        raise ValueError(
            f"nvidia.com/gpu: {whole} -- gpufence schedules GPU pods: ask for a whole number "
            ">= 1 of nvidia.com/gpu, a nvidia.com/mig-* instance, or leave schedulerName to "
            "the default scheduler"
        )
    return GpuRequest.whole(int(whole))


def _class(pod: ObservedPod) -> WorkloadClass:
    raw = pod.labels.get(names.LABEL_CLASS, WorkloadClass.TRAINING.value)
    try:
        return WorkloadClass(raw)
    except ValueError:
        known = ", ".join(c.value for c in WorkloadClass)
        raise ValueError(
            f"label {names.LABEL_CLASS}: {raw!r} is not a class (one of {known})"
        ) from None


def _gang(pod: ObservedPod, groups: Mapping[str, int | None]) -> tuple[str, int] | None:
    """(name, size) of the pod's gang: its PodGroup's (Kubernetes' gang API; size 0 while the
    PodGroup is not seen yet), else the annotation pair; None: a pod on its own."""
    if pod.group:
        if names.ANN_GANG_NAME in pod.annotations:
            msg = f"the pod names PodGroup {pod.group!r} and annotation {names.ANN_GANG_NAME}: "
            raise ValueError(msg + "use one of the two")
        key = f"{pod.namespace}/{pod.group}"
        if key not in groups:
            return pod.group, 0
        min_count = groups[key]
        return None if min_count is None else (pod.group, min_count)
    gang = pod.annotations.get(names.ANN_GANG_NAME)
    size = _number(pod, names.ANN_GANG_SIZE, _integer)
    if gang is None and size is None:
        return None
    if gang is None or size is None:
        raise ValueError(f"a gang needs both {names.ANN_GANG_NAME} and {names.ANN_GANG_SIZE}")
    if not _GANG_NAME.match(gang):
        msg = f"annotation {names.ANN_GANG_NAME}: {gang[:80]!r} is not a name (lowercase letters, "
        raise ValueError(msg + "digits, '-' and '.', at most 63, starting and ending alphanumeric)")
    if size < 1:
        raise ValueError(
            f"annotation {names.ANN_GANG_SIZE}: {size:g} is not "
            f"{names.USER_ANNOTATIONS[names.ANN_GANG_SIZE]}"
        )
    return gang, int(size)


def _queue(pod: ObservedPod, queues: Mapping[str, QueueSpec]) -> str:
    queue = pod.labels.get(names.LABEL_QUEUE, "")
    if not queue:
        return ""
    spec = queues.get(queue)
    if spec is None:
        raise ValueError(
            f"label {names.LABEL_QUEUE}: no queue {queue!r} (known: {', '.join(sorted(queues))})"
        )
    if spec.tenant and spec.tenant != pod.namespace:
        raise ValueError(
            f"label {names.LABEL_QUEUE}: queue {queue!r} belongs to tenant (namespace) "
            f"{spec.tenant!r}, not {pod.namespace!r}"
        )
    return queue


def read_pod(
    pod: ObservedPod,
    queues: Mapping[str, QueueSpec],
    groups: Mapping[str, int | None] | None = None,
    nodes: Mapping[str, GpuNodeFacts] | None = None,
) -> PodAsk | PodProblem:
    """The job a pod asks for, or what is wrong with it (one message, naming the key).
    ``nodes``: the GPU nodes, against which the pod's own node constraint is read as GPU
    types (kube/node_rules.py)."""
    try:
        checkpointable_raw = pod.annotations.get(names.ANN_CHECKPOINTABLE, "false").strip().lower()
        if checkpointable_raw not in _TRUE:
            raise ValueError(
                f'annotation {names.ANN_CHECKPOINTABLE}: {shown(checkpointable_raw)} is not "true" '
                'or "false"'
            )
        priority = _number(pod, names.ANN_PRIORITY, _integer) or 0
        job = Job(
            id=job_id_of(pod),
            workload_class=_class(pod),
            request=_gpu_request(pod),
            queue=_queue(pod, queues),
            partition=pod.labels.get(names.LABEL_PARTITION, ""),
            priority=int(priority),
            checkpointable=_TRUE[checkpointable_raw],
            est_runtime_s=_positive(pod, names.ANN_EST_RUNTIME),
            time_limit_s=_positive(pod, names.ANN_TIME_LIMIT),
            submit_time=pod.created,
            cpu_milli=pod.cpu_milli(),
            mem_mib=pod.mem_mib(),
            tenant=pod.namespace,
            gpu_types=gpu_types_for(pod.node_rule, nodes or {}),
        )
        gang = _gang(pod, groups or {})
        if gang is None and pod.group:
            job = replace(job, id=pod.key)  # a PodGroup without a gang policy
        return PodAsk(pod, job, gang)
    except ValueError as exc:
        return PodProblem(pod.key, str(exc))


@dataclass(frozen=True, slots=True)
class GangAsk:
    """A complete job: its pods in replica order (sorted by name: replica i is pods[i])."""

    job: Job
    pods: tuple[ObservedPod, ...]


def assemble(asks: Iterable[PodAsk]) -> tuple[list[GangAsk], list[PodProblem], dict[str, str]]:
    """Group readable pods into jobs: a lone pod is a job; a gang is a job once all its
    ``gang-size`` pods exist. Returns the complete jobs, the problems (members that disagree,
    more pods than the size), and the gangs still waiting for members (job id -> why)."""
    jobs: list[GangAsk] = []
    problems: list[PodProblem] = []
    waiting: dict[str, str] = {}
    gangs: dict[str, list[PodAsk]] = {}
    for ask in asks:
        if ask.gang is None:
            jobs.append(GangAsk(ask.job, (ask.pod,)))
        else:
            gangs.setdefault(ask.job.id, []).append(ask)
    for job_id, members in sorted(gangs.items()):
        members.sort(key=lambda a: a.pod.name)
        first = members[0]
        size = first.gang[1] if first.gang else 1
        odd = [
            a
            for a in members
            if a.gang != first.gang
            or a.job.shape() != first.job.shape()
            or a.job.queue != first.job.queue
            or a.job.partition != first.job.partition
        ]
        if odd:
            gang = first.gang[0] if first.gang else ""
            msg = f"gang {gang}: every pod must ask for the same resources, class, queue, "
            msg += f"partition and size as {first.pod.name}"
            problems.extend(PodProblem(a.pod.key, msg) for a in members)
        elif len(members) > size > 0:
            what = "PodGroup minCount" if first.pod.group else names.ANN_GANG_SIZE
            msg = f"gang has {len(members)} pods but {what} says {size}; gpufence binds a gang "
            msg += "whole: make the two agree"
            problems.extend(PodProblem(a.pod.key, msg) for a in members)
        elif size == 0:
            waiting[job_id] = f"waiting for PodGroup {first.pod.group} (not seen yet)"
        elif len(members) < size:
            waiting[job_id] = f"waiting for the gang's pods: {len(members)} of {size} exist"
        else:
            submit = max(a.job.submit_time for a in members)
            job = replace(
                first.job,
                replicas=size,
                submit_time=submit,
                priority=max(a.job.priority for a in members),
            )
            jobs.append(GangAsk(job, tuple(a.pod for a in members)))
    return jobs, problems, waiting
