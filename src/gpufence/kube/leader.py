"""Leader election on a coordination.k8s.io Lease, as kube-scheduler's replicas do.

The lease names its holder and when it last renewed. A candidate takes it when it is free or
its holder has not renewed for ``lease_s`` (optimistic concurrency: a replace carrying a stale
resourceVersion fails with 409, so two candidates never both win). The leader renews every
``renew_s``; if it cannot renew within ``lease_s`` of its last success it must assume another
replica took over, and ``lost`` is set -- the process then exits rather than schedule beside a
new leader (its pod is restarted and rejoins as a standby).

Times compare the holder's renewTime (written by another machine's clock) with ours, as client-go
does, so the lease should be several times any clock skew between replicas.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from gpufence.kube.api import ApiError, KubeApi

log = logging.getLogger("gpufence.kube")


def _utc(seconds: float) -> dt.datetime:
    # a MicroTime must carry its fraction: a whole second would be written without one, which
    # the API server refuses (one renewal in a million would fail)
    stamp = dt.datetime.fromtimestamp(seconds, dt.UTC)
    return stamp if stamp.microsecond else stamp.replace(microsecond=1)


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_s: float = 15.0,
        renew_s: float = 2.0,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.lease_s, self.renew_s, self.retry_s, self.clock = lease_s, renew_s, retry_s, clock
        self.leading = threading.Event()
        self.lost = threading.Event()
        self.holder = ""  # who holds the lease, as last read
        self.acquired_at: float | None = None
        self._last_renew = 0.0
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def _try(self) -> bool:
        """One attempt to take or renew the lease; True when we hold it afterwards."""
        now = self.clock()
        lease = self.api.get_lease(self.namespace, self.name)
        if lease is None:
            fresh = Lease(
                metadata=ObjectMeta(name=self.name, namespace=self.namespace),
                spec=self._spec(now, transitions=0, acquired=now),
            )
            self.api.create_lease(fresh)
            self.holder = self.identity
            return True
        spec = lease.spec or LeaseSpec()
        self.holder = spec.holderIdentity or ""
        renewed = spec.renewTime.timestamp() if spec.renewTime else 0.0
        duration = float(spec.leaseDurationSeconds or self.lease_s)
        mine = self.holder == self.identity
        if not mine and self.holder and now < renewed + duration:
            return False  # held and fresh
        acquired = spec.acquireTime.timestamp() if (mine and spec.acquireTime) else now
        transitions = (spec.leaseTransitions or 0) + (0 if mine else 1)
        lease.spec = self._spec(now, transitions, acquired)
        self.api.replace_lease(lease)  # carries the resourceVersion read: a race gives 409
        self.holder = self.identity
        return True

    def _spec(self, now: float, transitions: int, acquired: float) -> Any:
        return LeaseSpec(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, round(self.lease_s)),
            acquireTime=_utc(acquired),
            renewTime=_utc(now),
            leaseTransitions=transitions,
        )

    def run(self) -> None:
        """Campaign until leading, then renew until stopped or lost (then ``lost`` is set)."""
        while not self._stop.is_set():
            try:
                ok = self._try()
            except ApiError as exc:
                ok = False
                if exc.status.code != 409:
                    log.warning("lease %s/%s: %s", self.namespace, self.name, exc.status.message)
            except Exception as exc:
                ok = False
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            now = self.clock()
            if ok:
                self._last_renew = now
                if not self.leading.is_set():
                    self.acquired_at = now
                    log.info(
                        "leading as %s (lease %s/%s)", self.identity, self.namespace, self.name
                    )
                    self.leading.set()
            elif self.leading.is_set() and (
                now - self._last_renew >= self.lease_s or self.holder not in ("", self.identity)
            ):
                log.error("lost the lease %s/%s; stepping down", self.namespace, self.name)
                self.lost.set()
                return
            self._stop.wait(self.renew_s if self.leading.is_set() else self.retry_s)

    def release(self) -> None:
        """Give the lease up on a clean shutdown, so a standby need not wait it out."""
        if not self.leading.is_set():
            return
        try:
            lease = self.api.get_lease(self.namespace, self.name)
            if lease is not None and lease.spec and lease.spec.holderIdentity == self.identity:
                lease.spec.holderIdentity = None
                # None, not the epoch: a MicroTime the API server parses needs its fraction, and
                # lightkube writes a whole second without one (the release was refused)
                lease.spec.renewTime = None
                self.api.replace_lease(lease)
        except Exception as exc:
            log.warning("releasing the lease: %s", exc)
