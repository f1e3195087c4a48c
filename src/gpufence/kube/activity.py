"""GPU activity of running pods, for the core's idle reclaim of interactive sessions.

Two sources, either or both:

- the ``gpufence.io/gpu-activity`` annotation, ``"<utilisation 0..1> <seconds since the
  epoch>"``, which a notebook's sidecar refreshes (README, "On Kubernetes"): each new value is
  one sample, when it is recent (``max_age_s``: a value left from long ago, seen again after a
  restart, is not activity now);
- NVIDIA's DCGM exporter, read from Prometheus' HTTP API (``/api/v1/query``): the busiest GPU's
  ``DCGM_FI_DEV_GPU_UTIL`` (percent) of every pod, by its ``namespace`` and ``pod`` labels,
  polled every ``interval_s`` off the scheduling thread.

A sample becomes the core's ``Activity`` for the pod's job (a gang: its busiest member), as the
local plane's executor samples do (control/reconciler/loop.py). Whether that is idle, when a
session is warned and when its GPUs are taken back is the core's decision (sched/reclaim.py):
nothing here compares a figure with a threshold.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import urllib.parse
import urllib.request
from collections.abc import Mapping

from gpufence.kube import names
from gpufence.kube.objects import ObservedPod
from gpufence.kube.pods import shown
from gpufence.kube.tracker import Tracker
from gpufence.model.cluster import Cluster
from gpufence.model.events import Activity

log = logging.getLogger("gpufence.kube")

# the exporter's pod mapping labels each GPU's series with the pod that holds it
DCGM_QUERY = "max by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL)"
ACTIVITY_FORMAT = '"<utilisation 0..1> <seconds since the epoch>", e.g. "0.42 1765000000"'


def read_activity(value: str) -> tuple[float, float]:
    """(utilisation, when) of an annotation value; ValueError naming the format otherwise."""
    parts = value.split()
    try:
        util, when = (float(parts[0]), float(parts[1])) if len(parts) == 2 else (-1.0, 0.0)
    except ValueError:
        util, when = -1.0, 0.0
    if not 0.0 <= util <= 1.0 or not 0 < when < math.inf:  # (NaN fails both)
        raise ValueError(f"{names.ANN_GPU_ACTIVITY}={shown(value)}: give {ACTIVITY_FORMAT}")
    return util, when


def parse_query_result(body: Mapping[str, object]) -> dict[str, float]:
    """Pod key -> utilisation 0..1 from a ``/api/v1/query`` answer (an instant vector of
    percentages). ValueError when it is not one."""
    if body.get("status") != "success":
        raise ValueError(f"Prometheus answered {body.get('status')!r}: {body.get('error', '')}")
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise ValueError("Prometheus' answer is not an instant vector")
    out: dict[str, float] = {}
    for series in data.get("result") or ():
        labels, sample = series.get("metric") or {}, list(series.get("value") or [])
        ns, pod = labels.get("namespace"), labels.get("pod")
        if not ns or not pod or len(sample) != 2:
            continue  # a GPU no pod holds
        util = float(sample[1]) / 100.0
        if util == util:  # (NaN: no figure)
            out[f"{ns}/{pod}"] = max(out.get(f"{ns}/{pod}", 0.0), min(1.0, max(0.0, util)))
    return out


def query_prometheus(url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """One instant query of the busiest GPU of every pod."""
    q = urllib.parse.urlencode({"query": DCGM_QUERY})
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query?{q}", timeout=timeout_s) as r:
        return parse_query_result(json.loads(r.read()))


class PrometheusPoller:
    """Polls Prometheus every ``interval_s`` on a thread of its own; the loop takes the newest
    answer (each answer once). A failed query is logged (once per distinct error) and gives no
    samples: the sessions' idle clocks then run on the annotation alone."""

    def __init__(self, url: str, interval_s: float = 30.0) -> None:
        self.url, self.interval_s = url, interval_s
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._fresh: dict[str, float] | None = None
        self._last_error = ""
        self.queries = 0

    def start(self) -> None:
        threading.Thread(target=self._run, name="prometheus", daemon=True).start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            self.stop.wait(self.interval_s)

    def poll(self) -> None:
        try:
            got = query_prometheus(self.url)
        except Exception as exc:  # unreachable, not Prometheus, no exporter: said, not fatal
            if str(exc) != self._last_error:
                self._last_error = str(exc)
                log.warning("GPU activity from Prometheus at %s: %s", self.url, exc)
            return
        self._last_error = ""
        with self._lock:
            self._fresh, self.queries = got, self.queries + 1

    def take(self) -> dict[str, float]:
        with self._lock:
            got, self._fresh = self._fresh, None
        return got or {}


class ActivityFeed:
    """The samples seen since the last cycle, turned into the core's ``Activity`` events."""

    def __init__(self, prometheus: PrometheusPoller | None = None, max_age_s: float = 180.0):
        self.prometheus, self.max_age_s = prometheus, max_age_s
        self._stamp: dict[str, tuple[str, float]] = {}  # pod key -> (uid, newest stamp used)
        self._pending: dict[str, float] = {}  # pod key -> utilisation, not yet handed over
        self._bad: dict[str, str] = {}  # pod key -> the unreadable value already logged

    def pod_seen(self, pod: ObservedPod, now: float) -> None:
        """A pod of ours was added or changed: a new, recent annotation value is a sample."""
        value = pod.annotations.get(names.ANN_GPU_ACTIVITY)
        if value is None or pod.terminal or pod.deleting:
            return
        try:
            util, when = read_activity(value)
        except ValueError as exc:
            if self._bad.get(pod.key) != value:
                self._bad[pod.key] = value
                log.warning("pod %s: %s", pod.key, exc)
            return
        self._bad.pop(pod.key, None)
        last = self._stamp.get(pod.key)
        if last is not None and last[0] == pod.uid and when <= last[1]:
            return  # the same sample again (the pod changed for another reason)
        if abs(now - when) <= self.max_age_s:
            # only a recent stamp is remembered: one far ahead (a sidecar writing
            # milliseconds, a clock years off) would pass for every later sample's "newer"
            self._stamp[pod.key] = (pod.uid, when)
            self._pending[pod.key] = max(util, self._pending.get(pod.key, 0.0))

    def pod_gone(self, key: str) -> None:
        for d in (self._stamp, self._pending, self._bad):
            d.pop(key, None)

    def events(self, tracker: Tracker, cluster: Cluster) -> list[Activity]:
        """One ``Activity`` per running job of a reclaiming partition with a sample: the
        busiest of its pods (on the local plane: of its GPUs)."""
        samples, self._pending = self._pending, {}
        if self.prometheus is not None:
            for key, util in self.prometheus.take().items():
                samples[key] = max(util, samples.get(key, 0.0))
        per_job: dict[str, float] = {}
        for key, util in samples.items():
            jid = tracker.pod_job.get(key)
            core = tracker.jobs.get(jid) if jid is not None else None
            if core is None or core.phase != "running" or core.note is None:
                continue
            part = cluster.partitions.get(core.note.partition)
            if part is None or part.reclaim is None:
                continue  # (as the local plane: only sessions that can be reclaimed)
            per_job[core.job.id] = max(util, per_job.get(core.job.id, 0.0))
        return [Activity(jid, util) for jid, util in sorted(per_job.items())]
