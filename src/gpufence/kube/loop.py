"""The Kubernetes front end's loop: watches in, the core's step, API writes out.

One thread owns the core (as the reconciler does in the local plane): it drains what the
informers saw, turns it into the core's events (kube/tracker.py), steps the core, and hands the
resulting actions to the runner. The cluster model is rebuilt -- a fresh core restored from the
pods, exactly as after a restart -- when the GPU nodes change (added, removed, relabelled, or
capacity taken by pods gpufence does not schedule); readiness and cordons are plain events.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial

from gpufence.kube import dra_api, mig_glue, names
from gpufence.kube.actions import Action, BindPod, DeletePod, EvictPod, ShowPending
from gpufence.kube.activity import ActivityFeed
from gpufence.kube.api import KubeApi
from gpufence.kube.api_actions import ActionRunner, BindFailed
from gpufence.kube.fences import FenceSpec
from gpufence.kube.foreign import (
    LABEL_PREEMPTIBLE,
    ForeignPods,
    adopt,
    preemptible_label,
    tally,
    usage_of,
)
from gpufence.kube.hardware import Hardware, Usage, build_hardware, health_events
from gpufence.kube.informer import Change, Informer, Resync
from gpufence.kube.mig_configmap import MigConfigMap
from gpufence.kube.mig_recut import MigRecuts, whole_gpu_recuts
from gpufence.kube.node_rules import GpuNodeFacts
from gpufence.kube.objects import (
    ObservedNode,
    ObservedPod,
    observe_node,
    observe_pod,
    observe_pod_group,
)
from gpufence.kube.owners import OwnerCheck
from gpufence.kube.placement_notes import BindNote
from gpufence.kube.pod_claims import PodClaims
from gpufence.kube.state_record import Saved, StateRecord
from gpufence.kube.tracker import Tracker
from gpufence.kube.waits import waiting_reason
from gpufence.model.decisions import Decision, PendingReason, Reason
from gpufence.model.events import Event, JobRestored
from gpufence.sched.restore import RestoreConflict
from gpufence.sched.scheduler import Scheduler, SchedulerConfig

log = logging.getLogger("gpufence.kube")


@dataclass(slots=True)
class LoopStats:
    cycles: int = 0
    step_seconds: float = 0.0
    rebuilds: int = 0
    submitted: int = 0
    pending: int = 0
    running: int = 0
    synced: bool = False
    last_cycle: float = 0.0


class KubeScheduler:
    def __init__(
        self,
        api: KubeApi,
        fences: FenceSpec,
        *,
        clock: Callable[[], float] = time.time,
        reason_delay_s: float = 5.0,
        rebuild_every_s: float = 2.0,
        bind_workers: int = 32,
        state: StateRecord | None = None,
        activity: ActivityFeed | None = None,
        mig_configs: MigConfigMap | None = None,
    ) -> None:
        self.api, self.fences, self.clock = api, fences, clock
        self.names = fences.names
        self.reason_delay_s, self.rebuild_every_s = reason_delay_s, rebuild_every_s
        self.changes: queue.Queue[Resync | Change] = queue.Queue()
        self.failures: queue.Queue[BindFailed] = queue.Queue()
        self.stop = threading.Event()
        self.nodes: dict[str, ObservedNode] = {}
        self.pods: dict[str, ObservedPod] = {}  # every pod, ours or not
        self.inflight: dict[str, BindPod] = {}  # pod key -> bind sent, not yet seen
        self.runner = ActionRunner(
            api, self.failures, self._uid, workers=bind_workers, mig_configs=mig_configs
        )
        self.stats = LoopStats()
        self.hardware: Hardware | None = None
        self.core: Scheduler | None = None
        self.groups: dict[str, int | None] = {}  # PodGroups: namespace/name -> gang minCount
        self.tracker = Tracker(self.names.scheduler_name, fences.policy.queues, self.groups)
        self._kinds = {"node", "pod"}  # what must be listed before the first cycle
        self._down: dict[str, bool] = {}  # node -> stop_jobs of the NodeDown the core has
        self._rebuild_due: float | None = 0.0
        self._carry: list[Event] = []
        self._restore_actions: list[Action] = []  # what a rebuild's restore asked for
        self._disowned: set[str] = set()  # bound pods whose note could not be restored
        # partition -> foreign pod -> GPUs it holds there, as of the last rebuild (reasons)
        self.foreign = ForeignPods({}, {})  # what other schedulers' pods use (kube/foreign.py)
        self._now = self._last_reasons = 0.0
        self.lock = threading.Lock()  # held while the core steps; readers (HTTP) take it too
        self.state = state  # budgets and fair share kept across restarts (kube/state_record.py)
        self._saved: list[Event] = []  # what the record held at start-up, for the first core
        self._saved_awaiting: dict[str, tuple[str, int]] = {}  # (see Tracker.expected)
        self.activity = activity or ActivityFeed()  # GPU activity samples -> idle reclaim
        # MIG re-cuts through the GPU operator's MIG manager
        self.mig = MigRecuts(write_configs=mig_configs is not None)
        self.claims = PodClaims()  # DRA: pods seen through their ResourceClaims
        self.owners = OwnerCheck(api)  # requeued jobs whose controller is gone or done
        self._ends = (self.changes, self.stop)

    def _uid(self, namespace: str, pod: str) -> str:
        obj = self.pods.get(f"{namespace}/{pod}")
        return obj.uid if obj is not None else ""

    # -- the loop -------------------------------------------------------------------------------

    def start_informers(self) -> list[Informer]:
        informers = [
            Informer("node", self.api.list_nodes, self.api.watch_nodes, self.changes, self.stop),
            Informer("pod", self.api.list_pods, self.api.watch_pods, self.changes, self.stop),
        ]
        if self.api.serves_pod_groups():
            self._kinds.add("podgroup")
            informers.append(
                Informer(
                    "podgroup",
                    self.api.list_pod_groups,
                    self.api.watch_pod_groups,
                    self.changes,
                    self.stop,
                )
            )
        else:
            log.info("no scheduling.k8s.io/v1beta1 PodGroups served: gangs by annotation only")
        if dra_api.serves_dra(self.api):
            api = self.api
            self._kinds |= {"resourceslice", "resourceclaim"}
            for kind, lister, watcher in (
                ("resourceslice", dra_api.list_slices, dra_api.watch_slices),
                ("resourceclaim", dra_api.list_claims, dra_api.watch_claims),
            ):
                informers.append(
                    Informer(kind, partial(lister, api), partial(watcher, api), *self._ends)
                )
        for inf in informers:
            inf.start()
        return informers

    def run(self) -> None:
        if self.state is not None:
            saved = self.state.load()
            self._saved, self._saved_awaiting = saved.events(), saved.awaiting
        self.start_informers()
        synced: set[str] = set()
        try:
            while not self.stop.is_set():
                self._drain(synced, self._timeout())
                if synced != self._kinds:
                    continue
                self.cycle()
        finally:
            self.runner.close()
            if self.state is not None:
                self.state.close()

    def _timeout(self) -> float:
        wake = self.core.next_wakeup() if self.core is not None else None
        if wake is None:
            return 1.0
        return min(1.0, max(0.0, wake - self.clock()))

    def _drain(self, synced: set[str], timeout: float) -> None:
        try:
            item = self.changes.get(timeout=timeout)
        except queue.Empty:
            return
        batch = [item]
        while len(batch) < 20000:
            try:
                batch.append(self.changes.get_nowait())
            except queue.Empty:
                break
        for item in batch:
            if isinstance(item, Resync):
                synced.add(item.kind)
                self._resync(item)
            elif item.kind == "node":
                self._node_change(item)
            elif item.kind == "podgroup":
                self._group_change(item)
            elif item.kind in ("resourceslice", "resourceclaim"):
                self._dra_change(item.kind, [item.obj], item.type == "DELETED", False)
            else:
                self._pod_change(item)

    def _group_change(self, c: Change) -> None:
        group = observe_pod_group(c.obj)
        if c.type == "DELETED":
            self.groups.pop(group.key, None)
        elif self.groups.get(group.key, -1) == group.min_count:
            return
        else:
            self.groups[group.key] = group.min_count
        if self.core is not None:
            self.tracker.group_changed(group.key)

    def _dra_change(self, kind: str, objs: list[object], deleted: bool, whole: bool) -> None:
        """ResourceSlices change the GPUs of nodes that publish only those, and claims others
        allocated the devices left free (either: a rebuild); a claim lets the pods that wait
        for it through."""
        rebuild, keys = self.claims.change(
            kind, objs, deleted=deleted, whole=whole, ours=self._our_uids()
        )
        if rebuild:
            self._mark_rebuild()
        if kind == "resourceclaim":
            for pod in self.claims.unblocked(self.pods, keys):
                self._pod_seen(pod)  # the claim it waited for is here

    def _our_uids(self) -> set[str]:
        return {p.uid for p in self.pods.values() if self.tracker.ours(p)}

    def _resync(self, r: Resync) -> None:
        if r.kind in ("resourceslice", "resourceclaim"):
            self._dra_change(r.kind, list(r.objects), False, True)
            return
        if r.kind == "podgroup":
            fresh_groups = {g.key: g.min_count for g in map(observe_pod_group, r.objects)}
            changed = set(fresh_groups.items()) ^ set(self.groups.items())
            self.groups.clear()
            self.groups.update(fresh_groups)
            for key in {k for k, _ in changed}:
                if self.core is not None:
                    self.tracker.group_changed(key)
            return
        if r.kind == "node":
            fresh = {n.name: n for n in map(observe_node, r.objects)}
            for node in fresh.values():
                self.mig.node_seen(node)
            if fresh != self.nodes:
                self.nodes = fresh
                self._mark_rebuild()
            return
        fresh_pods = {p.key: p for p in map(observe_pod, r.objects)}
        for key in set(self.pods) - set(fresh_pods):
            self._pod_gone(key)
        for pod in fresh_pods.values():
            if self.pods.get(pod.key) != pod:
                self._pod_seen(pod)

    def _node_change(self, c: Change) -> None:
        node = observe_node(c.obj)
        old = self.nodes.get(node.name)
        if c.type == "DELETED":
            self.nodes.pop(node.name, None)
            self._mark_rebuild()
            return
        self.nodes[node.name] = node
        self.mig.node_seen(node)
        if old is None or _shape(old) != _shape(node):
            self._mark_rebuild()

    def _pod_change(self, c: Change) -> None:
        pod = observe_pod(c.obj)
        if c.type == "DELETED":
            self._pod_gone(pod.key)
        else:
            self._pod_seen(pod)

    def _pod_seen(self, pod: ObservedPod) -> None:
        old = self.pods.get(pod.key)
        self.pods[pod.key] = pod
        if pod.node:
            self.inflight.pop(pod.key, None)
        if self.tracker.ours(pod):
            self.activity.pod_seen(pod, self.clock())
            view = self.claims.view(pod)
            if self.core is not None and view is not None:
                self.tracker.pod_seen(view)
            if pod.terminal or pod.deleting:
                self.runner.forget(pod.namespace, pod.name)
                self.runner.run(self.claims.release(pod))
            was, now_ = self._unplanned(old), self._unplanned(pod)
            if was != now_ or (now_ and usage_of(old) != usage_of(pod)):
                self._mark_rebuild()  # it names us but runs where we did not place it
        else:
            if pod.key in self.tracker.pod_job and self.core is not None:
                self.tracker.pod_seen(pod)  # an adopted pod (kube/foreign.py): its ack, its end
            if usage_of(old) != usage_of(pod) or preemptible_label(old) != preemptible_label(pod):
                self._disowned.discard(pod.key)  # changed: may be adopted now
                self._mark_rebuild()

    def _unplanned(self, pod: ObservedPod | None) -> bool:
        """A pod naming us, bound not by us (``spec.nodeName``, a damaged note): foreign usage."""
        return (
            pod is not None
            and bool(pod.node)
            and not pod.terminal
            and pod.key not in self.inflight
            and (pod.key in self._disowned or BindNote.read(pod.annotations) is None)
        )

    def _pod_gone(self, key: str) -> None:
        pod = self.pods.pop(key, None)
        unplanned = self._unplanned(pod)  # (before it leaves inflight and disowned)
        self.inflight.pop(key, None)
        self._disowned.discard(key)
        if pod is None:
            return
        self.runner.forget(pod.namespace, pod.name)
        self.activity.pod_gone(key)
        self.runner.run(self.claims.gone(pod, self.tracker.ours(pod)))
        if self.core is not None and (self.tracker.ours(pod) or key in self.tracker.pod_job):
            self.tracker.pod_gone(key)
        if (not self.tracker.ours(pod) or unplanned) and usage_of(pod) != Usage():
            self._mark_rebuild()  # (what it used is free again)

    def _with_claims(self, a: Action) -> Action:
        """A bind of a pod with ResourceClaims carries their allocation (kube/pod_claims.py); a
        claim it cannot honour fails the bind, said on the pod."""
        done = self.claims.with_claims(a, self.pods)
        if isinstance(done, str) and isinstance(a, BindPod):
            self.failures.put(BindFailed(a.namespace, a.pod, done, False))
            log.error("bind %s/%s: %s", a.namespace, a.pod, done)
            return ShowPending(a.namespace, a.pod, names.CONDITION_REASON_PENDING, done)
        assert not isinstance(done, str)
        return done

    def _mark_rebuild(self) -> None:
        if self._rebuild_due is None:
            self._rebuild_due = self.clock() + self.rebuild_every_s

    # -- one cycle ------------------------------------------------------------------------------

    def cycle(self) -> None:
        now = max(self._now, self.clock())
        self._now = now
        gone = self.owners.gone(self.tracker.awaiting(), now)  # (API reads: before the lock)
        with self.lock:
            if self._rebuild_due is not None and now >= self._rebuild_due:
                self._rebuild(now)
            assert self.core is not None and self.hardware is not None
            while True:
                try:
                    f = self.failures.get_nowait()
                except queue.Empty:
                    break
                for line in self.tracker.bind_failed(f.namespace, f.pod, f.why, f.gone):
                    log.warning("%s", line)
            self.tracker.controllers_gone(gone)
            self.tracker.submit_ready()
            mig_events, mig_actions = mig_glue.take(
                self.mig,
                self.core,
                self.hardware.cluster,
                self.nodes,
                self.tracker,
                self.runner.node_refusals,
                self.runner.configs_written,
                now,
            )
            events, actions = self.tracker.take()
            events, actions = mig_events + events, mig_actions + actions
            actions = self._restore_actions + actions
            self._restore_actions = []
            events = self._carry + self._node_events() + events
            events += self.activity.events(self.tracker, self.hardware.cluster)
            t0 = time.perf_counter()
            decisions = self.core.step(events, now)
            self.stats.step_seconds += time.perf_counter() - t0
            self.tracker.decide(self.hardware.cluster, decisions, now)
            # (what the core must hear of a re-cut that cannot be asked for: the next cycle)
            refused = mig_glue.decide(
                self.mig, self.core, self.hardware.cluster, self.nodes, decisions, now
            )
            if self.state is not None:
                q, usage = self.core.query, self.core.fair_share_usage()
                windows, defrags = q.preemption_windows(), q.defrag_windows()
                self.state.maybe_save(windows, usage, now, self.tracker.awaiting(), defrags)
            self._carry, more = self.tracker.take()
            self._carry += refused
            actions += more
            self.stats.cycles += 1
            self.stats.last_cycle = now
            self.stats.synced = True
            self.stats.pending = self.core.pending_count()
            self.stats.running = len(self.tracker.jobs) - self.stats.pending
            actions = [self._with_claims(a) for a in actions]
            for a in actions:
                if isinstance(a, BindPod):
                    self.inflight[f"{a.namespace}/{a.pod}"] = a
            if now - self._last_reasons >= 2.0:
                self._last_reasons = now
                actions += self._reasons(now)
        self.runner.run(actions)

    def _node_events(self) -> list[Event]:
        assert self.hardware is not None
        tolerated = self.names.tolerated_taints
        return health_events(self.hardware.cluster, self.nodes, tolerated, self._down)

    def _rebuild(self, now: float) -> None:
        """A fresh core over the nodes as they are now, restored from the pods (and the binds
        sent but not yet seen): the start-up path, taken again."""
        self._rebuild_due = None
        self.foreign = tally(
            self.pods.values(),
            lambda p: not self.tracker.ours(p) or self._unplanned(p),
            self._disowned,
            self._partition_of,
        )
        foreign = dict(self.foreign.per_node)
        for node, devices in self.claims.held_by_others(self._our_uids()).items():
            foreign[node] = foreign.get(node, Usage()) + Usage(devices=devices)
        old = self.core
        nodes = [self.claims.book.with_slice_gpus(n) for n in self.nodes.values()]
        hw = build_hardware(self.fences, nodes, foreign)
        self.hardware = replace(hw, cluster=whole_gpu_recuts(hw.cluster))
        if old is None:
            self.mig.load(self.nodes.values())
        for line in self.hardware.problems:
            log.warning("%s", line)
        self.core = Scheduler(self.hardware.cluster, SchedulerConfig())
        # the MIG layouts re-cuts left (and those in flight) before any job is restored on them
        self.core.step(self.mig.restore_events(self.hardware.cluster), now)
        # notices given but not yet seen back in the watch are overlaid too, so that a rebuild
        # right after a notice neither forgets it nor gives another
        noticed = {
            f"{c.namespace}/{p}": c.notice
            for c in self.tracker.jobs.values()
            if c.notice
            for p in c.pods
        }
        expected = self.tracker.awaiting() if old is not None else self._saved_awaiting
        facts = {
            n.name: GpuNodeFacts(self.nodes[n.name].labels, n.gpu_type)
            for n in self.hardware.cluster.nodes
        }
        self.tracker = Tracker(
            self.names.scheduler_name, self.fences.policy.queues, self.groups, expected, facts
        )
        self._down = {}
        self._carry = []
        pods = [self._with_inflight(p, noticed.get(p.key)) for p in self.pods.values()]
        views = [v for p in pods if (v := self.claims.view(p) if p.claims else p) is not None]
        self.tracker.restore(self.hardware.cluster, views)
        self._restore_each(now)
        if old is not None:
            # the old core's history and spent budgets: a rebuild is no fresh start either
            q, usage = old.query, old.fair_share_usage()
            kept = Saved(q.preemption_windows(), usage, now, defrags=q.defrag_windows())
            self._carry += kept.events()
        else:
            self._carry += self._saved
        self.stats.rebuilds += 1
        log.info(
            "cluster model: %d GPU nodes, %d GPUs, %d pods of ours",
            len(self.hardware.cluster.nodes),
            len(self.hardware.cluster.gpus),
            len(self.tracker.pods),
        )

    def _restore_each(self, now: float) -> None:
        """Hand the restored jobs to the core one by one: one whose GPUs another restored job
        already holds (two notes claiming the same GPUs: a forged or hand-made note) is not
        restored -- it is disowned, its pods count as foreign usage from the next rebuild, and
        the scheduler goes on instead of failing on it."""
        assert self.core is not None and self.hardware is not None
        events, actions = self.tracker.take()
        # (one refused already stays used capacity till it changes: else a rebuild every 2 s)
        maybe = [p for p in self.pods.values() if p.key not in self._disowned]
        adoption = adopt(self.tracker, self.hardware.cluster, maybe, events)
        events += adoption.events
        for key, why in adoption.refused.items():
            log.info("not adopting %s (label %s): %s", key, LABEL_PREEMPTIBLE, why)
            self._disowned.add(key)  # used capacity from the next rebuild
            self._mark_rebuild()
        disowned: set[str] = set()
        decided: list[Decision] = []
        for ev in events:
            if not isinstance(ev, JobRestored):
                self._carry.append(ev)
                continue
            try:
                # (a restored notice already past its deadline is stopped right here)
                decided += self.core.step([ev], now)
            except RestoreConflict as exc:
                log.error("not restoring %s where its pods run: %s", ev.job.id, exc)
                for key in self.tracker.disown(ev.job.id):
                    disowned.add(key)
                    self._disowned.add(key)
                self._mark_rebuild()
        assert self.hardware is not None
        self.tracker.decide(self.hardware.cluster, decided, now)
        more_events, more = self.tracker.take()
        self._carry += more_events
        self._restore_actions = [
            a
            for a in actions + more
            if not isinstance(a, BindPod | DeletePod | EvictPod)
            or f"{a.namespace}/{a.pod}" not in disowned
        ]

    def _partition_of(self, node_name: str) -> str | None:
        node = self.nodes.get(node_name)
        return self.fences.partition_of(node.labels)[0] if node is not None else None

    def _foreign_blocker(self, jid: str) -> str:
        assert self.core is not None
        if jid not in self.core.jobs() or self.hardware is None:
            return ""
        return self.foreign.blocker(self.hardware.cluster, self.core.job(jid).home)

    def _with_inflight(self, pod: ObservedPod, notice: str | None = None) -> ObservedPod:
        if notice and pod.annotations.get(names.ANN_NOTICE) != notice:
            pod = replace(pod, annotations={**pod.annotations, names.ANN_NOTICE: notice})
        sent = self.inflight.get(pod.key)
        if sent is None or pod.node:
            return pod
        annotations = {**pod.annotations, **sent.note.annotations(sent.pod)}
        return replace(pod, node=sent.node, annotations=annotations)

    def _reasons(self, now: float) -> list[ShowPending]:
        assert self.core is not None
        out: list[ShowPending] = []
        due = now - self.reason_delay_s
        refused = self.runner.evictions.refused()
        for jid, core_job in self.tracker.jobs.items():
            if core_job.phase != "pending" or core_job.job.submit_time > due:
                continue
            pending = self.core.why_pending(jid)
            if pending is None:
                continue
            message, gist = self._told(jid, pending, refused, now)
            out.extend(
                ShowPending(core_job.namespace, p, names.CONDITION_REASON_PENDING, message, gist)
                for p in core_job.pods
            )
        out += self.claims.shown(self.pods, due)
        for jid, why in self.tracker.waiting.items():
            for ask in self.tracker.asks.get(jid, {}).values():
                if ask.pod.created <= due:
                    out.append(
                        ShowPending(
                            ask.pod.namespace, ask.pod.name, names.CONDITION_REASON_PENDING, why
                        )
                    )
        return out

    def _told(
        self, jid: str, pending: PendingReason, refused: Mapping[str, str], now: float
    ) -> tuple[str, str]:
        """A waiting pod's message and gist: the core's reason, with what only the front end
        knows added (foreign pods in the way, the MIG manager's progress or failure, the
        victims' checkpoints and refused evictions)."""
        assert self.core is not None and self.hardware is not None
        message, gist = f"{pending.reason.value}: {pending.message}", ""
        if pending.reason in _CAPACITY and (held := self._foreign_blocker(jid)):
            message += f"; {held}"
        if pending.reason is Reason.RECONFIGURING:
            told_mig = mig_glue.waiting(self.mig, self.core, self.hardware.cluster, jid, now)
            if told_mig[0]:
                message, gist = (f"{pending.reason.value}: {t}" for t in told_mig)
        failed = self.mig.failure_for(jid)
        if failed:
            message, gist = f"{failed}; {message}", f"{failed}; {gist or message}"
        if pending.reason is Reason.WAITING_PREEMPTION:
            victims = self.core.waiting_on(jid)
            told = waiting_reason(victims, self.tracker, refused, now)
            if told is not None:
                message = f"{pending.reason.value}: {told[0]}"
                gist = f"{pending.reason.value}: {told[1]}"
        return message, gist


# reasons a job waits for room, to which what foreign pods hold is added
_CAPACITY = frozenset(
    (Reason.NO_FIT, Reason.FRAGMENTED, Reason.PREEMPTION_BUDGET, Reason.MIN_RUNTIME)
)


def _shape(node: ObservedNode) -> tuple[object, ...]:
    """What changes the model (a rebuild); readiness and cordons are events instead, and so
    are a MIG manager's re-cuts (its labels, the instances it advertises: kube/mig_recut.py)."""
    mig_labels = (names.NODE_MIG_CONFIG, names.NODE_MIG_STATE)
    labels = {k: v for k, v in node.labels.items() if k not in mig_labels}
    mig = bool(node.mig) if names.NODE_MIG_CONFIG in node.labels else node.mig
    return (labels, node.gpus, mig, node.cpu_milli, node.mem_mib)
