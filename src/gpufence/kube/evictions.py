"""Evictions the core decided (its ``Stop``), carried out through the Eviction API and retried
until the pod is gone.

An eviction a PodDisruptionBudget forbids is answered ``429``; it is tried again with growing
pauses (``first_retry_s`` doubling up to ``max_retry_s``) and never replaced by a delete: the
budget is the operator's word on how many pods may be down. Meanwhile the refusal is kept per
pod (``refused``) so that the pending reason of the job waiting for the GPUs names it, and it is
recorded once per new message as an ``EvictionRefused`` Event on the pod. The retries stop when
the pod is seen terminating or gone (``forget``).

One thread works the queue: a stop is a handful of calls, and a retry must not hold a bind
worker while it waits.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpufence.kube.actions import EvictPod
from gpufence.kube.api import CallFailed, KubeApi

log = logging.getLogger("gpufence.kube")


@dataclass(slots=True)
class _Pending:
    action: EvictPod
    tries: int = 0
    refused: str = ""  # the API server's last refusal ("" before the first)


class Evictions:
    def __init__(
        self,
        api: KubeApi,
        uid_of: Callable[[str, str], str],
        *,
        first_retry_s: float = 1.0,
        max_retry_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api, self.uid_of, self.clock = api, uid_of, clock
        self.first_retry_s, self.max_retry_s = first_retry_s, max_retry_s
        self.evicted = 0
        self._pending: dict[str, _Pending] = {}  # pod key -> its eviction, until it is gone
        self._due: list[tuple[float, int, str]] = []  # (when, order, pod key)
        self._order = 0
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="evict", daemon=True)
        self._thread.start()

    def submit(self, a: EvictPod) -> None:
        key = f"{a.namespace}/{a.pod}"
        with self._cv:
            if key in self._pending:
                return  # already being evicted (a repeated stop changes nothing)
            self._pending[key] = _Pending(a)
            self._push(key, self.clock())

    def forget(self, namespace: str, pod: str) -> None:
        """The pod is terminating or gone: its eviction is done."""
        with self._cv:
            self._pending.pop(f"{namespace}/{pod}", None)

    def refused(self) -> dict[str, str]:
        """Pod key -> why its eviction is refused right now (it is being retried)."""
        with self._cv:
            return {k: p.refused for k, p in self._pending.items() if p.refused}

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=5)

    def _push(self, key: str, when: float) -> None:
        self._order += 1
        heapq.heappush(self._due, (when, self._order, key))
        self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (not self._due or self._due[0][0] > self.clock()):
                    wait = self._due[0][0] - self.clock() if self._due else None
                    self._cv.wait(wait)
                if self._closed:
                    return
                _, _, key = heapq.heappop(self._due)
                pending = self._pending.get(key)
            if pending is not None:
                self._try(key, pending)

    def _try(self, key: str, p: _Pending) -> None:
        a = p.action
        if p.tries == 0:
            self._event(a, "Preempted", f"gpufence stops the pod (eviction): {a.why}")
        p.tries += 1
        try:
            self.api.evict_pod(a.namespace, a.pod)
        except CallFailed as exc:
            if exc.code == 404:  # gone already
                self.forget(a.namespace, a.pod)
                return
            self._refused(key, p, exc.message if exc.code == 429 else f"{exc.code}: {exc.message}")
            return
        except Exception as exc:  # the API server unreachable: try again later
            self._refused(key, p, f"eviction failed: {exc}")
            return
        with self._cv:
            self.evicted += 1
            p.refused = ""  # evicted: nothing holds it any more
            # done once the pod is seen terminating (forget); until then a lost answer is
            # retried, and an eviction of a pod already terminating is harmless
            if key in self._pending:
                self._push(key, self.clock() + self.max_retry_s)

    def _refused(self, key: str, p: _Pending, why: str) -> None:
        a = p.action
        new = why != p.refused
        delay = min(self.max_retry_s, self.first_retry_s * 2 ** (p.tries - 1))
        with self._cv:
            if key not in self._pending:
                return
            p.refused = why
            self._push(key, self.clock() + delay)
        if new:
            log.warning("eviction of %s refused (retrying): %s", key, why)
            retry = f"retried every {self.max_retry_s:g} s at most"
            self._event(a, "EvictionRefused", f"eviction refused, {retry}: {why}")

    def _event(self, a: EvictPod, reason: str, message: str) -> None:
        try:
            uid = self.uid_of(a.namespace, a.pod)
            self.api.record_event(a.namespace, a.pod, uid, reason, message)
        except Exception as exc:  # an Event is for people: the eviction goes on without it
            log.warning("event %s for %s/%s: %s", reason, a.namespace, a.pod, exc)
