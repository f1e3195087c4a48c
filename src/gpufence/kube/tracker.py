"""Pods as the core sees them: observations in, the core's events out; decisions in, API
actions out. No I/O: the loop (kube/loop.py) feeds it what the watches saw and carries out the
actions it returns.

A job's life on Kubernetes: its pods appear (a gang: once all of them exist) -> JobSubmitted;
Bind -> the pods are bound, each carrying the placement (kube/placement_notes.py); the pods end
(Succeeded / Failed) -> JobFinished; the user deletes them -> JobCancelled; Notice -> the
``gpufence.io/notice`` annotation, answered by the workload's ``gpufence.io/checkpointed`` ->
CheckpointAck; Stop -> the pods are evicted and, once gone, JobStopped. A bound pod cannot be
moved: a requeued job whose pods have a controller (a Job) waits, held, for the controller's new
pods, which become its next attempt (same job id, attempt + 1); one without (a bare pod) is
dropped (JobCancelled).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace

from gpufence.kube import actions as act
from gpufence.kube import names
from gpufence.kube.actions import Action, AnnotatePod, BindPod, DeletePod, EvictPod, ShowPending
from gpufence.kube.core_jobs import CoreJob, acks, notice_value, read_notice
from gpufence.kube.node_rules import GpuNodeFacts
from gpufence.kube.objects import ObservedPod
from gpufence.kube.placement_notes import BindNote, assignments_of, plan_of
from gpufence.kube.pods import (
    PodAsk,
    PodProblem,
    assemble,
    changeable,
    in_pod_terms,
    job_id_of,
    read_pod,
)
from gpufence.model.cluster import Cluster
from gpufence.model.decisions import (
    Bind,
    Cancel,
    Decision,
    MigReconfigure,
    Notice,
    NoticeWithdrawn,
    Reason,
    Reject,
    Requeue,
    Stop,
)
from gpufence.model.events import (
    CheckpointAck,
    Event,
    JobCancelled,
    JobFinished,
    JobHeld,
    JobReleased,
    JobRestored,
    JobStopped,
    JobSubmitted,
    JobUpdated,
)
from gpufence.model.job import Job
from gpufence.model.partition import QueueSpec
from gpufence.sched.intake import invalid

log = logging.getLogger("gpufence.kube")


class Tracker:
    def __init__(
        self,
        scheduler_name: str,
        queues: Mapping[str, QueueSpec],
        groups: Mapping[str, int | None] | None = None,
        expected: Mapping[str, tuple[str, int]] | None = None,
        nodes: Mapping[str, GpuNodeFacts] | None = None,
    ) -> None:
        self.scheduler_name = scheduler_name
        self.queues = queues
        # the GPU nodes of the model this tracker feeds: pods' node constraints are read
        # against them (a change of node labels rebuilds the model and the tracker)
        self.nodes: Mapping[str, GpuNodeFacts] = nodes or {}
        # PodGroups (namespace/name -> gang minCount, None: no gang policy), kept by the loop
        self.groups: Mapping[str, int | None] = groups if groups is not None else {}
        self.jobs: dict[str, CoreJob] = {}
        self.asks: dict[str, dict[str, PodAsk]] = {}  # job id -> pod key -> ask (not submitted)
        self._ask_job: dict[str, str] = {}  # pod key -> the job id its ask is filed under
        self.problems: dict[str, str] = {}  # pod key -> why it is refused (shown once)
        self.waiting: dict[str, str] = {}  # gang job id -> why it is not submitted yet
        self.pods: dict[str, ObservedPod] = {}  # every pod of ours, by key
        self._dirty_jobs: set[str] = set()
        self.pod_job: dict[str, str] = {}  # pod key -> the core's job id, while the core has it
        # job ids the core has seen: a pod recreated under the same name (a StatefulSet's, a
        # gang restarted by its controller) is a new job and gets a new id ("ns/name#2")
        self._used_ids: dict[str, int] = {}
        # pods the core or the reader refused, with what they said then: not read again
        # until their labels or annotations change (the user's fix) or they are recreated
        self._refused: dict[str, tuple[str, dict[str, str], dict[str, str]]] = {}
        # controller -> the requeued job whose next attempt its new pods are (see _requeue)
        self.requeued: dict[str, str] = {}
        # controller -> (job id, attempt) of a requeued job a restart or a rebuild carried over
        # before its new pods came: they are submitted as that job's next attempt
        self.expected: dict[str, tuple[str, int]] = dict(expected or {})
        self.events: list[Event] = []
        self.actions: list[Action] = []
        self._said_refused: dict[str, str] = {}  # pod key -> the refused change it was told of

    # -- observations -------------------------------------------------------------------------

    def ours(self, pod: ObservedPod) -> bool:
        return pod.scheduler_name == self.scheduler_name

    def pod_seen(self, pod: ObservedPod) -> None:
        """A pod was added or changed."""
        old = self.pods.get(pod.key)
        if old is not None and old.uid != pod.uid:
            self.pod_gone(old.key)  # replaced under the same name: the old one is gone
        self.pods[pod.key] = pod
        jid = self.pod_job.get(pod.key) or job_id_of(pod)
        core = self.jobs.get(jid)
        if core is not None and pod.name in core.uids and core.uids[pod.name] == pod.uid:
            self._member_changed(jid, core, pod)
            return
        if pod.node or pod.terminal or pod.deleting:
            return  # bound by someone else or over: not ours to place
        if self._refused.get(pod.key) == (pod.uid, pod.labels, pod.annotations):
            return  # refused as it is; a change (the fix) reads it again
        self._refused.pop(pod.key, None)
        ask = read_pod(pod, self.queues, self.groups, self.nodes)
        if isinstance(ask, PodProblem):
            self._refuse(pod, ask.message)
            self._drop_ask(pod.key)
            return
        self.problems.pop(pod.key, None)
        carried = self.expected.get(pod.owner)
        if carried is not None and carried[0] not in self.jobs:
            ask = replace(ask, job=replace(ask.job, id=carried[0]))
        requeued = self.jobs.get(self.requeued.get(pod.owner, ""))
        if requeued is not None:
            requeued.fresh[pod.name] = pod
            self._attach_if_ready(self.requeued[pod.owner], requeued)
            return
        if core is not None:
            # a new pod for a job the core already has (a gang member replaced, a pod of a
            # finished gang's name reused): wait until that job is over
            self._put_ask(ask)
            return
        self._put_ask(ask)
        self._dirty_jobs.add(ask.job.id)

    def disown(self, jid: str) -> list[str]:
        """The core would not take this restored job back (its GPUs are another's): forget it
        without an event; its pods stay known (never submitted: they are bound). Returns their
        keys."""
        core = self.jobs.pop(jid, None)
        if core is None:
            return []
        keys = [f"{core.namespace}/{name}" for name in core.pods]
        for key in keys:
            self.pod_job.pop(key, None)
        return keys

    def group_changed(self, key: str) -> None:
        """A PodGroup appeared, changed or went: read its pods again (their gang size)."""
        namespace, _, name = key.partition("/")
        for pod in list(self.pods.values()):
            if pod.namespace == namespace and pod.group == name and pod.key not in self.pod_job:
                self._refused.pop(pod.key, None)
                self.problems.pop(pod.key, None)
                self._drop_ask(pod.key)
                self.pod_seen(pod)

    def _refuse(self, pod: ObservedPod, message: str) -> None:
        self._refused[pod.key] = (pod.uid, pod.labels, pod.annotations)
        if self.problems.get(pod.key) != message:
            self.problems[pod.key] = message
            self._show(pod, names.CONDITION_REASON_REJECTED, message)

    def pod_gone(self, key: str) -> None:
        pod = self.pods.pop(key, None)
        self.problems.pop(key, None)
        self._refused.pop(key, None)
        self._said_refused.pop(key, None)
        self._drop_ask(key)
        if pod is None:
            return
        jid = self.pod_job.get(key, "")
        core = self.jobs.get(jid)
        if core is not None and core.uids.get(pod.name) == pod.uid:
            self._member_gone(jid, core, pod.name)

    def _put_ask(self, ask: PodAsk) -> None:
        if self._ask_job.get(ask.pod.key, ask.job.id) != ask.job.id:
            self._drop_ask(ask.pod.key)  # its gang changed: no longer filed under the old one
        self.asks.setdefault(ask.job.id, {})[ask.pod.key] = ask
        self._ask_job[ask.pod.key] = ask.job.id

    def _drop_ask(self, key: str) -> None:
        jid = self._ask_job.pop(key, None)
        asks = self.asks.get(jid, {}) if jid is not None else {}
        if jid is not None and asks.pop(key, None) is not None:
            self._dirty_jobs.add(jid)
            if not asks:
                del self.asks[jid]

    def _member_changed(self, jid: str, core: CoreJob, pod: ObservedPod) -> None:
        self._maybe_acked(jid, core, pod)
        self._maybe_updated(jid, core, pod)
        if pod.terminal and pod.name not in core.ended:
            core.ended[pod.name] = pod.phase == "Succeeded"
            self._maybe_over(jid, core)
        elif pod.deleting and core.phase == "pending":
            self._member_gone(jid, core, pod.name)

    def _maybe_updated(self, jid: str, core: CoreJob, pod: ObservedPod) -> None:
        """A member's priority or time-limit annotation changed (``kubectl annotate``): the
        core's ``JobUpdated``, as ``gpufence update`` sends it on the local plane (who may is
        RBAC on the pod). A gang's priority is its members' highest, as at submit; its time
        limit the changed member's. An unreadable value changes nothing."""
        if core.phase not in ("pending", "running") or pod.terminal or pod.deleting:
            return
        try:
            members = [m for n in core.pods if (m := self.pods.get(f"{core.namespace}/{n}"))]
            priority = max(changeable(m)[0] for m in members or [pod])
            limit = changeable(pod)[1]
        except ValueError as exc:
            self._update_refused(pod, str(exc))
            return
        job = core.job
        changes: dict[str, int | float] = {}
        if priority != job.priority:
            changes["priority"] = priority
        if limit is not None and limit != job.time_limit_s:
            changes["time_limit_s"] = limit
        refused = invalid(replace(job, **changes)) if changes else None  # type: ignore[arg-type]
        if refused is not None:  # (the core would drop it: the user is told instead)
            self._update_refused(pod, in_pod_terms(refused.message))
        elif changes:
            self._said_refused.pop(pod.key, None)
            core.job = replace(job, **changes)  # type: ignore[arg-type]
            self.events.append(JobUpdated(jid, **changes))  # type: ignore[arg-type]

    def _update_refused(self, pod: ObservedPod, why: str) -> None:
        """An Event on the pod, once per refusal: it changes at every sidecar write."""
        if self._said_refused.get(pod.key) != why:
            self._said_refused[pod.key] = why
            text = f"{why}; the job keeps its priority and time limit"
            self.actions.append(act.PodEvent(pod.namespace, pod.name, "UpdateRefused", text))

    def _member_gone(self, jid: str, core: CoreJob, pod: str) -> None:
        if core.phase == "pending":
            # a gang lost a member before it was bound: the job is withdrawn; the rest wait
            # (as asks) for the member to come back
            self._forget(jid, JobCancelled(jid))
            for name in core.pods:
                other = self.pods.get(f"{core.namespace}/{name}")
                if other is not None and name != pod:
                    self.pod_seen(other)
            return
        if pod not in core.ended:
            core.ended[pod] = False
        self._maybe_over(jid, core)

    def _maybe_over(self, jid: str, core: CoreJob) -> None:
        if len(core.ended) < len(core.pods):
            if core.phase == "running" and not all(core.ended.values()):
                # a gang member failed or vanished while the others run: all-or-nothing holds
                # for the whole run, so the rest are stopped too
                self._delete_rest(core, "a member of its gang ended")
            return
        if core.phase == "stopping":
            self.events.append(JobStopped(jid))
            if core.stop_requeue and core.owner in self.requeued:
                self._requeue(jid, core)
            else:
                self._forget(jid, JobCancelled(jid))
            return
        self._forget(jid, JobFinished(jid, succeeded=all(core.ended.values())))

    def _maybe_acked(self, jid: str, core: CoreJob, pod: ObservedPod) -> None:
        """A member copied the notice in flight into ``gpufence.io/checkpointed``: the job's
        checkpoint is written (one member's word is the job's: rank 0 writes it). An older
        value (a notice since withdrawn) acknowledges nothing."""
        if not core.acked and acks(pod, core.notice):
            core.acked = True
            self.events.append(CheckpointAck(jid))

    def _delete_rest(self, core: CoreJob, why: str, *, evict: bool = False) -> None:
        """Tell the members still there to go: by eviction for the core's Stop (their
        PodDisruptionBudget is honoured), by delete for a gang already broken (all-or-nothing:
        a member failed, or it cannot be restored)."""
        if core.torn_down:
            return
        core.torn_down = True
        for name in core.pods:
            if name not in core.ended:
                cls = EvictPod if evict else DeletePod
                self.actions.append(cls(core.namespace, name, why))

    def _forget(self, jid: str, event: Event) -> None:
        self.events.append(event)
        core = self.jobs.pop(jid, None)
        if core is not None and self.requeued.get(core.owner) == jid:
            del self.requeued[core.owner]
        for name in core.pods if core is not None else ():
            self.pod_job.pop(f"{core.namespace}/{name}", None)  # type: ignore[union-attr]
        base = jid.split("#", 1)[0]
        if self.asks.get(base):
            self._dirty_jobs.add(base)

    def _requeue(self, jid: str, core: CoreJob) -> None:
        """A stopped job whose controller makes its pods again (a Job's, a JobSet's): it stays
        the core's job -- requeued by the core as its next attempt, held while it has no pods
        to bind -- and the controller's new pods become that attempt (``_attach_if_ready``):
        the same job id, so fair share and accounting carry on, and ``gpufence.io/attempt`` in
        their bind note tells the workload to resume from its checkpoint."""
        for name in core.pods:
            self.pod_job.pop(f"{core.namespace}/{name}", None)
        core.pods, core.uids, core.ended = (), {}, {}
        core.phase, core.torn_down, core.notice, core.acked = "requeued", False, "", False
        self.events.append(JobHeld(jid))
        self._attach_if_ready(jid, core)

    def awaiting(self) -> dict[str, tuple[str, int]]:
        """Controller -> (job id, next attempt) of every requeued job still waiting for its
        controller's new pods: what a restart or a rebuild must not forget."""
        out = dict(self.expected)
        for owner, jid in self.requeued.items():
            core = self.jobs.get(jid)
            if core is not None and core.phase == "requeued":
                out[owner] = (jid, core.attempt)
        return out

    def controllers_gone(self, gone: Mapping[str, str]) -> None:
        """The controllers requeued jobs wait for that will make no pods (owner -> why,
        kube/owners.py): each such job is cancelled rather than held forever, and a restart no
        longer carries it."""
        for owner, why in gone.items():
            carried = self.expected.pop(owner, None)
            jid = self.requeued.get(owner) or (carried[0] if carried else "")
            core = self.jobs.get(jid)
            if core is not None and core.phase == "requeued":
                self._forget(jid, JobCancelled(jid))
            elif carried is None:
                continue  # its pods came meanwhile (the look was made before): nothing to do
            log.warning("requeued job %s: its controller %s is %s; cancelled", jid, owner, why)

    def _attach_if_ready(self, jid: str, core: CoreJob) -> None:
        live = {n: p for n, p in core.fresh.items() if self.pods.get(p.key) == p}
        if core.phase != "requeued" or len(live) < core.job.replicas:
            return
        pods = sorted(live.values(), key=lambda p: (p.created, p.name))[: core.job.replicas]
        core.fresh = {}
        core.pods = tuple(p.name for p in pods)
        core.uids = {p.name: p.uid for p in pods}
        core.phase = "pending"
        self.pod_job.update((p.key, jid) for p in pods)
        del self.requeued[core.owner]
        self.events.append(JobReleased(jid))

    def submit_ready(self) -> None:
        """Jobs whose pods are all there become JobSubmitted."""
        dirty, self._dirty_jobs = self._dirty_jobs, set()
        asks = [
            a
            for jid in sorted(dirty)
            if jid not in self.jobs
            for a in self.asks.get(jid, {}).values()
        ]
        for jid in dirty:
            self.waiting.pop(jid, None)
        ready, problems, waiting = assemble(asks)
        self.waiting.update(waiting)
        for p in problems:
            pod = self.pods.get(p.pod)
            if pod is not None:
                self._refuse(pod, p.message)
        for gang in ready:
            first = gang.pods[0]
            job = self._fresh_id(gang.job)
            self.pod_job.update((p.key, job.id) for p in gang.pods)
            self.jobs[job.id] = CoreJob(
                job=job,
                namespace=first.namespace,
                pods=tuple(p.name for p in gang.pods),
                uids={p.name: p.uid for p in gang.pods},
                owner=first.owner if len({p.owner for p in gang.pods}) == 1 else "",
            )
            carried = self.expected.get(first.owner)
            if carried is not None and carried[0] == job.id:
                self.jobs[job.id].attempt = carried[1]
                del self.expected[first.owner]
            for key in self.asks.pop(gang.job.id, {}):
                self._ask_job.pop(key, None)
            self.events.append(JobSubmitted(job))

    def _fresh_id(self, job: Job) -> Job:
        n = self._used_ids.get(job.id, 0) + 1
        self._used_ids[job.id] = n
        return job if n == 1 else replace(job, id=f"{job.id}#{n}")

    # -- restore ------------------------------------------------------------------------------

    def restore(self, cluster: Cluster, pods: Iterable[ObservedPod]) -> None:
        """Rebuild from the pods alone (start-up, a new leader, a changed cluster): bound
        pods carrying gpufence's note become JobRestored where they run; a gang a crash left
        half bound is rolled forward (its plan binds the rest); everything else is observed
        afresh as pending."""
        bound: dict[str, list[ObservedPod]] = {}
        for pod in pods:
            if not self.ours(pod):
                continue
            note = BindNote.read(pod.annotations) if pod.node else None
            if note is None:
                self.pod_seen(pod)
                continue
            self.pods[pod.key] = pod
            bound.setdefault(note.job_id, []).append(pod)
        for jid, members in sorted(bound.items()):
            self._restore_job(cluster, jid, members)

    def _restore_job(self, cluster: Cluster, jid: str, members: list[ObservedPod]) -> None:
        note = BindNote.read(members[0].annotations)
        assert note is not None
        ask = read_pod(members[0], self.queues, self.groups, self.nodes)
        assignments = assignments_of(cluster, note.plan)
        by_name = {p.name: p for p in members}
        namespace = members[0].namespace
        if isinstance(ask, PodProblem) or assignments is None:
            # not restorable where it runs (its node left the model, or shrank): a single pod
            # keeps running and counts as foreign usage; a gang is rolled back -- no half
            # gang runs after a restart
            if len(note.plan) > 1:
                for m in note.plan:
                    pod = by_name.get(m.pod)
                    if pod is not None and not pod.terminal:
                        why = "its gang cannot be restored where it was placed"
                        self.actions.append(DeletePod(namespace, m.pod, why))
            return
        job = replace(ask.job, id=jid, replicas=len(note.plan))
        core = CoreJob(
            job, namespace, tuple(m.pod for m in note.plan), {}, phase="running", note=note
        )
        core.owner, core.attempt = members[0].owner, note.attempt
        for m in note.plan:
            pod = by_name.get(m.pod) or self.pods.get(f"{namespace}/{m.pod}")
            if pod is None:
                core.ended[m.pod] = False  # gone (or never created)
                continue
            core.uids[m.pod] = pod.uid
            if pod.terminal:
                core.ended[m.pod] = pod.phase == "Succeeded"
            elif not pod.node:
                self.actions.append(BindPod(namespace, m.pod, m.node, note))  # roll forward
        stopping = any(p.deleting for p in members)
        notice = self.take_back_notice(core, members)
        stop_reason, requeue = None, False
        if stopping:
            notice, (stop_reason, requeue) = None, self._restored_stop(jid, core)
        self.jobs[jid] = core
        self.pod_job.update((f"{namespace}/{name}", jid) for name in core.uids)
        base = jid.split("#", 1)[0]
        self._used_ids[base] = max(
            self._used_ids.get(base, 0), int(jid.split("#", 1)[1]) if "#" in jid else 1
        )
        self.events.append(
            JobRestored(
                job=job,
                pool=note.partition,
                assignments=assignments,
                attempt=note.attempt,
                started_at=note.bound_at,
                lent_from=note.lent_from,
                notice=notice,
                stopping=stop_reason,
                requeue=requeue,
            )
        )
        if core.acked:  # answered while no scheduler ran
            self.events.append(CheckpointAck(jid))
        if stopping:
            core.phase = "stopping"
            self._delete_rest(core, "it was being stopped before the restart")
        self._maybe_over(jid, core)

    def _restored_stop(self, jid: str, core: CoreJob) -> tuple[Reason, bool]:
        """A job being stopped before the restart: the stop's reason (its notice's, when it had
        one), and whether it is requeued -- a controller's job is, through its new pods."""
        reason = (read_notice(core.notice) or (Reason.QUEUED, 0.0))[0]
        core.notice, core.acked = "", False
        requeue = bool(core.owner) and core.owner not in self.requeued
        if requeue:
            core.stop_requeue = True
            self.requeued[core.owner] = jid
        return reason, requeue

    @staticmethod
    def take_back_notice(core: CoreJob, members: list[ObservedPod]) -> tuple[Reason, float] | None:
        """The notice a restored (or adopted) job's pods carry, as the core reads it (None:
        none). It lives on the pods: a restart takes it back instead of forgetting it or giving
        a second one. ``core`` records its value and whether a member acknowledged it."""
        for pod in members:
            value = pod.annotations.get(names.ANN_NOTICE, "")
            notice = read_notice(value) if value else None
            if notice is not None:
                core.notice = value
                core.acked = any(acks(p, value) for p in members)
                return notice
        return None

    # -- decisions ----------------------------------------------------------------------------

    def decide(self, cluster: Cluster, decisions: Iterable[Decision], now: float) -> None:
        for d in decisions:
            core = self.jobs.get(d.job_id) if not isinstance(d, MigReconfigure) else None
            if isinstance(d, Bind) and core is not None:
                plan = plan_of(cluster, core.pods, d.assignments)
                note = BindNote(d.job_id, d.partition, d.lent_from, core.attempt, now, plan)
                core.phase, core.note = "running", note
                self.actions.extend(BindPod(core.namespace, m.pod, m.node, note) for m in plan)
            elif isinstance(d, Stop) and core is not None:
                core.phase, core.stop_requeue = "stopping", d.requeue
                if d.requeue and core.owner and core.owner not in self.requeued:
                    # its controller makes the next attempt's pods (maybe before these go)
                    self.requeued[core.owner] = d.job_id
                why = f"{d.reason.value}: {d.message}".rstrip(": ")
                if d.requeue and not core.owner:
                    # the core would requeue it, but nothing makes a bare pod again: say so
                    # on the pod (its Preempted Event outlives it), the job ends here
                    why += "; no controller makes the pod again, so its job ends here, preempted"
                self._delete_rest(core, why, evict=True)
                self._maybe_over(d.job_id, core)
            elif isinstance(d, Notice | NoticeWithdrawn) and core is not None:
                value = notice_value(d.reason, d.deadline) if isinstance(d, Notice) else None
                core.notice, core.acked = value or "", False
                text = f"{'notice' if value else 'notice withdrawn'}: {d.reason.value} {d.message}"
                self.actions.extend(
                    AnnotatePod(core.namespace, p, names.ANN_NOTICE, value, text.strip())
                    for p in core.pods
                )
            elif isinstance(d, Reject | Cancel) and core is not None:
                self.jobs.pop(d.job_id, None)
                for p in core.pods:
                    self.pod_job.pop(f"{core.namespace}/{p}", None)
                for p in core.pods:
                    pod = self.pods.get(f"{core.namespace}/{p}")
                    if pod is not None:
                        # the core speaks the CLI's and the job's words, a pod its own
                        self._refuse(pod, f"{d.reason.value}: {in_pod_terms(d.message)}")
            elif isinstance(d, Requeue) and core is not None:
                core.attempt = d.attempt  # (written through the next bind: the resume path)

    def bind_failed(self, namespace: str, pod: str, why: str, gone: bool) -> list[str]:
        """A bind the API refused: the pod is gone (deleted meanwhile) or bound elsewhere.
        The job cannot run as planned; its bound members are stopped and it is withdrawn."""
        jid = self.pod_job.get(f"{namespace}/{pod}", "")
        core = self.jobs.get(jid)
        if core is None or core.phase != "running":
            return []
        core.ended[pod] = False
        self._delete_rest(core, f"bind of {pod} failed: {why}")
        what = "was deleted" if gone else "could not be bound"
        self._forget(jid, JobCancelled(jid))
        return [f"job {jid}: pod {pod} {what} ({why}); the job is withdrawn"]

    def _show(self, pod: ObservedPod, reason: str, message: str) -> None:
        self.actions.append(ShowPending(pod.namespace, pod.name, reason, message))

    def take(self) -> tuple[list[Event], list[Action]]:
        events, self.events = self.events, []
        actions, self.actions = self.actions, []
        return events, actions
