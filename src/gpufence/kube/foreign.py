"""Pods other schedulers placed (kube-scheduler's, another batch scheduler's) on gpufence's nodes.

By default such a pod is used capacity and nothing more: its GPUs are taken off its node in the
model (kube/hardware.py), so gpufence never books them twice and never preempts it. A pending
job that finds its fence full is told how much of it foreign pods hold, and which.

A foreign pod may opt in to being preempted with the label ``gpufence.io/preemptible: "true"``.
It is then adopted as a *checkpointable* job of its namespace, running where it runs (the core's
JobRestored on free GPUs of its node): a serving surge may name it as a victim like any
checkpointable pod of gpufence's -- it gets the ``gpufence.io/notice`` annotation, and is
evicted (policy/v1, PodDisruptionBudgets honoured) once it copies the notice into
``gpufence.io/checkpointed`` or at the notice's deadline. Its other scheduler never learns of
this; gpufence never rebinds it (it is not gpufence's to place: an evicted foreign pod's next
pod is the other scheduler's again). A pod that cannot be adopted (a request that is not whole
GPUs, a class its node's fence does not admit, a namespace without a queue there) stays plain
used capacity, and so does a member of a gang (a PodGroup's, or ``gpufence.io/gang-name``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from gpufence.kube import names
from gpufence.kube.core_jobs import CoreJob
from gpufence.kube.hardware import Usage
from gpufence.kube.objects import ObservedPod
from gpufence.kube.pods import PodProblem, read_pod
from gpufence.kube.tracker import Tracker
from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Assignment
from gpufence.model.events import Event, JobRestored

LABEL_PREEMPTIBLE = names.PREFIX + "preemptible"


def opted_in(pod: ObservedPod | None) -> bool:
    """A bound, live foreign pod that said gpufence may preempt it."""
    return (
        pod is not None
        and pod.labels.get(LABEL_PREEMPTIBLE, "").strip().lower() == "true"
        and bool(pod.node)
        and not pod.terminal
        and not pod.deleting  # (on its way out: used capacity until it is gone)
    )


def gpus_of(pod: ObservedPod) -> int:
    got = pod.requests.get(names.RES_GPU)
    return int(got) if got is not None else 0


@dataclass(frozen=True, slots=True)
class Adoption:
    events: list[Event]  # JobRestored of each adopted pod
    refused: dict[str, str]  # pod key -> why it stays plain used capacity


def adopt(
    tracker: Tracker,
    cluster: Cluster,
    pods: Iterable[ObservedPod],
    restored: Iterable[Event],
) -> Adoption:
    """The opted-in foreign ``pods`` as jobs the core takes back where they run, on GPUs of
    their node that no ``restored`` job of gpufence's holds (lowest first: the model does not
    know which device the other scheduler's plugin gave it, and the core only counts them).
    Each adopted pod is the tracker's from here on (its ack, its end, its eviction)."""
    held = {
        g for ev in restored if isinstance(ev, JobRestored) for a in ev.assignments for g in a.gpus
    }
    out = Adoption([], {})
    for pod in sorted(pods, key=lambda p: (p.created, p.key)):
        if tracker.ours(pod) or not opted_in(pod):
            continue
        got = _restored(tracker, cluster, pod, held)
        if isinstance(got, str):
            out.refused[pod.key] = got
            continue
        held.update(got.assignments[0].gpus)
        out.events.append(got)
        core = CoreJob(got.job, pod.namespace, (pod.name,), {pod.name: pod.uid}, phase="running")
        notice = Tracker.take_back_notice(core, [pod])
        if notice is not None:
            out.events[-1] = replace(got, notice=notice)
        tracker.jobs[got.job.id] = core
        tracker.pods[pod.key] = pod
        tracker.pod_job[pod.key] = got.job.id
    return out


def _restored(
    tracker: Tracker, cluster: Cluster, pod: ObservedPod, held: set[int]
) -> JobRestored | str:
    idx = cluster.node_by_name.get(pod.node)
    if idx is None:
        return f"its node {pod.node} is not a GPU node of any fence"
    node = cluster.nodes[idx]
    want = gpus_of(pod)
    if want <= 0 or any(k.startswith(names.RES_MIG_PREFIX) for k in pod.requests):
        return "it asks for no whole GPUs"
    gang = pod.group or pod.annotations.get(names.ANN_GANG_NAME)
    if gang:
        # (its members would share the gang's job id; and evicting one member alone would
        # break a gang its scheduler placed whole)
        return f"it is a member of gang {gang}: only a pod on its own is adopted"
    free = [g for g in node.gpu_ids if g not in held]
    if len(free) < want:
        return f"node {node.name} has {len(free)} GPUs not held by gpufence's pods, it uses {want}"
    ask = read_pod(pod, tracker.queues, tracker.groups, tracker.nodes)
    if isinstance(ask, PodProblem):
        return ask.message
    job = replace(ask.job, partition=node.group, checkpointable=True, replicas=1)
    return JobRestored(
        job=job,
        pool=node.group,
        assignments=(Assignment(node=idx, gpus=tuple(free[:want])),),
        started_at=pod.created,
    )


def foreign_note(held: Mapping[str, Mapping[str, int]], partitions: Iterable[str]) -> str:
    """What foreign pods hold in ``partitions`` (partition -> pod key -> GPUs), for a pending
    reason: "pods of other schedulers hold 4 GPUs of training (ns/a: 2, ns/b: 2), never
    preempted (label gpufence.io/preemptible=true to allow it)"; "" when they hold none."""
    said = []
    total = 0
    for p in dict.fromkeys(partitions):
        pods = held.get(p) or {}
        n = sum(pods.values())
        if n:
            total += n
            each = ", ".join(f"{k}: {g}" for k, g in sorted(pods.items()))
            said.append(f"{n} GPUs of {p} ({each})")
    if not total:
        return ""
    return (
        f"pods of other schedulers hold {'; '.join(said)}, used capacity gpufence never "
        f"preempts (unless labelled {LABEL_PREEMPTIBLE}=true)"
    )


def usage_of(pod: ObservedPod | None) -> Usage:
    """What a pod of another scheduler takes off its node: its whole GPUs, CPU and memory
    while it is bound and not ended."""
    if pod is None or not pod.node or pod.terminal:
        return Usage()
    gpus = pod.requests.get(names.RES_GPU)
    whole = int(gpus) if gpus is not None else 0
    return Usage(whole, pod.cpu_milli(), pod.mem_mib())


def preemptible_label(pod: ObservedPod | None) -> str:
    """A pod's opt-in to preemption by gpufence: a change rebuilds the model."""
    return pod.labels.get(LABEL_PREEMPTIBLE, "") if pod is not None else ""


@dataclass(slots=True)
class ForeignPods:
    """What pods gpufence did not place use: per node (capacity the model leaves out) and per
    fence (what the reasons of pods waiting there name)."""

    per_node: dict[str, Usage]
    held: dict[str, dict[str, int]]  # partition -> pod key -> GPUs

    def blocker(self, cluster: Cluster, home: str) -> str:
        """What they hold where a job of ``home`` could run: its fence and the fences it may
        preempt in ("" when none)."""
        part = cluster.partitions.get(home)
        donors = part.preemption.from_partitions if part is not None else ()
        return foreign_note(self.held, (home, *donors)) if self.held else ""


def tally(
    pods: Iterable[ObservedPod],
    foreign: Callable[[ObservedPod], bool],
    disowned: set[str],
    partition_of: Callable[[str], str | None],
) -> ForeignPods:
    """Sum what the ``foreign`` pods use; an opted-in one is left out (the restore adopts it,
    on its node's GPUs) unless it was disowned (it could not be adopted)."""
    out = ForeignPods({}, {})
    for pod in pods:
        if not foreign(pod) or (opted_in(pod) and pod.key not in disowned):
            continue
        usage = usage_of(pod)
        if usage == Usage():
            continue
        out.per_node[pod.node] = out.per_node.get(pod.node, Usage()) + usage
        part = partition_of(pod.node)
        if part is not None and gpus_of(pod) > 0:
            out.held.setdefault(part, {})[pod.key] = gpus_of(pod)
    return out
