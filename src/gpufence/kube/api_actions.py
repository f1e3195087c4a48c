"""Carry out the tracker's actions against the API server, concurrently, binds first.

Binds go to a wide pool (pooled HTTP/1.1 connections): a burst of a thousand binds
takes as long as the slowest few, not their sum. Pending reasons are writes a user reads, not
scheduling: they go to a narrow pool, only when the reason changed, and at most once per
``reason_interval_s`` per pod (an Event at most once per ``event_interval_s``), so ten thousand
waiting pods cannot crowd out the binds.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gpufence.kube import dra_api, names
from gpufence.kube.actions import (
    Action,
    AnnotatePod,
    BindPod,
    DeletePod,
    EvictPod,
    LabelNode,
    PodEvent,
    ShowPending,
)
from gpufence.kube.api import CallFailed, KubeApi
from gpufence.kube.dra_objects import ClaimRelease
from gpufence.kube.evictions import Evictions
from gpufence.kube.mig_configmap import LAG_SUSPECT_S, MigConfigMap

log = logging.getLogger("gpufence.kube")


@dataclass(frozen=True, slots=True)
class BindFailed:
    namespace: str
    pod: str
    why: str
    gone: bool  # 404: the pod was deleted meanwhile


@dataclass(slots=True)
class Counts:
    binds: int = 0
    bind_errors: int = 0
    deletes: int = 0
    reasons: int = 0
    events: int = 0
    bind_seconds: float = 0.0


class ActionRunner:
    def __init__(
        self,
        api: KubeApi,
        failures: queue.Queue[BindFailed],
        uid_of: Callable[[str, str], str],
        *,
        workers: int = 32,
        reason_interval_s: float = 30.0,
        event_interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        mig_configs: MigConfigMap | None = None,
    ) -> None:
        self.api = api
        self.failures = failures
        self.uid_of = uid_of
        self.counts = Counts()
        self._fast = ThreadPoolExecutor(workers, thread_name_prefix="bind")
        self._slow = ThreadPoolExecutor(4, thread_name_prefix="reason")
        self._reason_interval, self._event_interval = reason_interval_s, event_interval_s
        self._shown: dict[str, tuple[str, float, float]] = {}  # pod -> (message, at, event at)
        self._lock = threading.Lock()
        self._clock = clock
        self.evictions = Evictions(api, uid_of)
        self.node_refusals: queue.Queue[tuple[str, str]] = queue.Queue()  # (node, why)
        # MIG configs written into the MIG manager's ConfigMap, one at a time, each before its
        # node's label (kube/mig_configmap.py): (node, written s before the label, wait s)
        self.mig_configs = mig_configs
        self.configs_written: queue.Queue[tuple[str, float | None, float]] = queue.Queue()
        self._mig = ThreadPoolExecutor(1, thread_name_prefix="mig-config")

    def close(self) -> None:
        self._mig.shutdown(wait=False, cancel_futures=True)
        self.evictions.close()
        self._fast.shutdown(wait=True, cancel_futures=False)
        self._slow.shutdown(wait=False, cancel_futures=True)

    def run(self, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, BindPod):
                self._fast.submit(self._bind, a)
            elif isinstance(a, DeletePod):
                self._fast.submit(self._delete, a)
            elif isinstance(a, EvictPod):
                self.evictions.submit(a)
            elif isinstance(a, AnnotatePod):
                self._fast.submit(self._annotate, a)
            elif isinstance(a, ShowPending):
                self._maybe_show(a)
            elif isinstance(a, LabelNode) and a.config is not None:
                self._mig.submit(self._config_then_label, a)
            elif isinstance(a, LabelNode | PodEvent):
                self._fast.submit(self._node_or_event, a)
            elif isinstance(a, ClaimRelease):
                self._fast.submit(self._release, a)

    def forget(self, namespace: str, pod: str) -> None:
        """The pod is terminating or gone: nothing more to show on it or evict."""
        self.evictions.forget(namespace, pod)
        with self._lock:
            self._shown.pop(f"{namespace}/{pod}", None)

    def _bind(self, a: BindPod) -> None:
        t0 = time.perf_counter()
        try:
            for claim in a.claims:  # DRA: the devices first, so the bind runs on them
                dra_api.allocate(self.api, claim)
            self.api.bind(a.namespace, a.pod, a.node, a.note.annotations(a.pod))
            with self._lock:
                self.counts.binds += 1
                self.counts.bind_seconds += time.perf_counter() - t0
        except CallFailed as exc:
            with self._lock:
                self.counts.bind_errors += 1
            if exc.code == 409 and "already assigned" in exc.message:
                # bound already: a roll-forward or retry of a bind that did land. Not a failure
                # if it went where we meant it to (the watch shows which)
                log.info("bind %s/%s: %s", a.namespace, a.pod, exc.message)
                return
            self.failures.put(BindFailed(a.namespace, a.pod, exc.message, exc.code == 404))
        except Exception as exc:
            with self._lock:
                self.counts.bind_errors += 1
            self.failures.put(BindFailed(a.namespace, a.pod, str(exc), False))

    def _release(self, a: ClaimRelease) -> None:
        try:
            dra_api.release(self.api, a)
        except Exception as exc:
            log.warning("release ResourceClaim %s/%s: %s", a.namespace, a.claim, exc)

    def _delete(self, a: DeletePod) -> None:
        try:
            self.api.record_event(
                a.namespace,
                a.pod,
                self.uid_of(a.namespace, a.pod),
                "Preempted",
                f"gpufence stops the pod: {a.why}",
            )
            self.api.delete_pod(a.namespace, a.pod)
            with self._lock:
                self.counts.deletes += 1
        except CallFailed as exc:
            if exc.code != 404:
                log.warning("delete %s/%s: %s", a.namespace, a.pod, exc.message)
        except Exception as exc:
            log.warning("delete %s/%s: %s", a.namespace, a.pod, exc)

    def _annotate(self, a: AnnotatePod) -> None:
        try:
            self.api.annotate_pod(a.namespace, a.pod, a.key, a.value)
            if a.event:
                self.api.record_event(
                    a.namespace, a.pod, self.uid_of(a.namespace, a.pod), "Notice", a.event, "Normal"
                )
        except Exception as exc:
            log.warning("annotate %s/%s: %s", a.namespace, a.pod, exc)

    def _node_or_event(self, a: LabelNode | PodEvent) -> None:
        try:
            if isinstance(a, LabelNode):
                self.api.patch_node(a.node, a.labels, a.annotations)
            else:
                uid = self.uid_of(a.namespace, a.pod)
                self.api.record_event(a.namespace, a.pod, uid, a.reason, a.message)
        except Exception as exc:
            log.warning("%s: %s", a, exc)
            if isinstance(a, LabelNode):  # the re-cut it asked for is not coming
                self.node_refusals.put((a.node, str(exc)))

    def _config_then_label(self, a: LabelNode) -> None:
        """The config into the MIG manager's ConfigMap, then (once its mounted file can hold
        it) the label: the MIG manager fails a label naming a config its file lacks."""
        assert self.mig_configs is not None and a.config is not None
        try:
            wait = self.mig_configs.ensure(a.config)
        except Exception as exc:  # (CallFailed, a config.yaml gpufence cannot read)
            log.warning("%s: %s", self.mig_configs.source, exc)
            self.node_refusals.put((a.node, f"{self.mig_configs.source}: {exc}"))
            return
        ago = self.mig_configs.written_ago(a.config.name)
        # a config written shortly before its label: a failed state may be the mounted file
        fresh = ago + wait if ago is not None and ago + wait < LAG_SUSPECT_S else None
        self.configs_written.put((a.node, fresh, wait))
        if wait > 0:
            # a timer, not a sleep: the next node's config need not wait behind this one
            timer = threading.Timer(wait, self._node_or_event, args=(a,))
            timer.daemon = True
            timer.start()
        else:
            self._node_or_event(a)

    def _maybe_show(self, a: ShowPending) -> None:
        key, now = f"{a.namespace}/{a.pod}", self._clock()
        gist = a.gist or a.message  # (a countdown in the message is no change)
        with self._lock:
            last = self._shown.get(key)
            if last is not None and last[0] == gist and now - last[1] < self._reason_interval:
                return
            event_due = last is None or last[0] != gist or now - last[2] >= self._event_interval
            self._shown[key] = (gist, now, now if event_due else last[2] if last else now)
        self._slow.submit(self._show, a, event_due)

    def _show(self, a: ShowPending, event: bool) -> None:
        try:
            self.api.set_pending(a.namespace, a.pod, a.reason, a.message)
            if event:
                uid = self.uid_of(a.namespace, a.pod)
                reason = (
                    "FailedScheduling" if a.reason == names.CONDITION_REASON_PENDING else "Rejected"
                )
                self.api.record_event(a.namespace, a.pod, uid, reason, a.message)
            with self._lock:
                self.counts.reasons += 1
                self.counts.events += int(event)
        except CallFailed as exc:
            if exc.code not in (404, 409):
                log.warning("pending reason %s/%s: %s", a.namespace, a.pod, exc.message)
        except Exception as exc:
            log.warning("pending reason %s/%s: %s", a.namespace, a.pod, exc)
