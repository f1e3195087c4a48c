"""What the core must keep across scheduler restarts on Kubernetes, kept in the API server.

The API server is the store (docs/kubernetes.md). Running jobs, their attempts and start times
(the minimum runtime before a job may be preempted: the thrash guard) and notices in flight live
on the pods. What outlives the pods -- the incident preemptions still counted against each
fence's budget window, the MIG defrag stops against each MIG pool's ``defrag_budget``, each
queue's fair-share history, and the requeued jobs still waiting for
their controller's new pods (so that those pods are the job's next attempt even after a restart)
-- is kept here, as annotations on a
``coordination.k8s.io`` Lease beside the leader's (``<lease-name>-state`` in the lease
namespace). A Lease, not the Fence objects: Leases are always served (the Fence CRDs may not be
installed), the record is one small object the ClusterRole can grant by name, and it is not
rewritten by the status publisher.

Budget windows and requeued jobs are written as soon as they change (a notice just took a
slot), from a thread of its own; fair share at most every ``usage_every_s``. A missing or
unreadable record is said once in the log: the scheduler then starts with whole budgets and no
history, as a first start.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gpufence.kube.api import CallFailed, KubeApi
from gpufence.kube.names import PREFIX
from gpufence.model.events import DefragsRestored, Event, PreemptionsRestored, UsageRestored

log = logging.getLogger("gpufence.kube")

ANN_PREEMPTIONS = PREFIX + "preemptions"  # {"fence": [times of counted notices], ...}
ANN_DEFRAGS = PREFIX + "mig-defrags"  # {"MIG pool": [times of defrag notices], ...}
ANN_FAIR_SHARE = PREFIX + "fair-share"  # {"at": t, "usage": {"queue": milli-GPU-s}}
# {"Job/<uid>": ["ns/job", attempt]}: requeued jobs waiting for their controller's new pods
ANN_REQUEUED = PREFIX + "requeued"

Windows = Mapping[str, tuple[float, ...]]


@dataclass(frozen=True, slots=True)
class Saved:
    windows: dict[str, tuple[float, ...]]
    usage: dict[str, float] | None
    usage_at: float
    awaiting: dict[str, tuple[str, int]] = field(default_factory=dict)
    defrags: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def events(self) -> list[Event]:
        out: list[Event] = []
        if self.usage:
            out.append(UsageRestored(tuple(sorted(self.usage.items())), self.usage_at))
        if self.windows:
            out.append(PreemptionsRestored(tuple(sorted(self.windows.items()))))
        if self.defrags:
            out.append(DefragsRestored(tuple(sorted(self.defrags.items()))))
        return out


# what a hand-edited value may break json.loads with besides ValueError: nesting deep enough
# to exhaust the recursion limit, a number too large for an integer
_UNREADABLE = (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError)


def _number(value: object) -> float:
    """A number gpufence wrote (JSON numbers only: a string is not one, "123" is not [1, 2, 3])."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{value!r} is not a number")
    return float(value)


def _windows(raw: object) -> dict[str, tuple[float, ...]]:
    if not isinstance(raw, dict) or not all(isinstance(ts, list) for ts in raw.values()):
        raise TypeError("not a mapping of fence -> list of times")
    return {str(p): tuple(t for t in map(_number, ts) if math.isfinite(t)) for p, ts in raw.items()}


def _usage(raw: object) -> tuple[float, dict[str, float] | None]:
    if raw is None:
        return 0.0, None
    if not isinstance(raw, dict) or not isinstance(raw["usage"], dict):
        raise TypeError("not a mapping with at and usage: {queue: milli-GPU-s}")
    return _number(raw["at"]), {str(q): _number(v) for q, v in raw["usage"].items()}


def _awaiting(raw: object) -> dict[str, tuple[str, int]]:
    if not isinstance(raw, dict):
        raise TypeError("not a mapping")
    out: dict[str, tuple[str, int]] = {}
    for owner, (jid, attempt) in raw.items():
        if not isinstance(jid, str) or isinstance(attempt, bool) or not isinstance(attempt, int):
            raise TypeError(f"{owner}: [{jid!r}, {attempt!r}] is not [job id, attempt]")
        if attempt < 1:
            raise ValueError(f"{owner}: attempt {attempt} (attempts count from 1)")
        out[str(owner)] = (jid, attempt)
    return out


def decode(annotations: Mapping[str, str]) -> Saved:
    """The record's annotations; a damaged value is dropped (named in the log), never
    guessed: the budget is then whole, as after a first start."""
    windows = _read_windows(annotations, ANN_PREEMPTIONS, "fence")
    defrags = _read_windows(annotations, ANN_DEFRAGS, "MIG pool")
    usage: dict[str, float] | None = None
    at = 0.0
    try:
        at, usage = _usage(json.loads(annotations.get(ANN_FAIR_SHARE, "null")))
    except _UNREADABLE as exc:
        log.error("state record: %s is not {at, usage}: %s", ANN_FAIR_SHARE, _cut(exc))
    awaiting: dict[str, tuple[str, int]] = {}
    try:
        awaiting = _awaiting(json.loads(annotations.get(ANN_REQUEUED, "{}")))
    except _UNREADABLE as exc:
        msg = "state record: %s is not {controller: [job, attempt]}: %s"
        log.error(msg, ANN_REQUEUED, _cut(exc))
    return Saved(windows, usage, at, awaiting, defrags)


def _read_windows(
    annotations: Mapping[str, str], key: str, what: str
) -> dict[str, tuple[float, ...]]:
    """A budget window annotation ({name: [times]}); empty (named in the log) when damaged."""
    try:
        return _windows(json.loads(annotations.get(key, "{}")))
    except _UNREADABLE as exc:
        log.error("state record: %s is not {%s: [times]}: %s", key, what, _cut(exc))
        return {}


def _cut(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def encode(
    windows: Windows,
    usage: Mapping[str, float],
    at: float,
    awaiting: Mapping[str, tuple[str, int]] | None = None,
    defrags: Windows | None = None,
) -> dict[str, str]:
    return {
        ANN_REQUEUED: json.dumps(
            {o: [j, n] for o, (j, n) in sorted((awaiting or {}).items())}, separators=(",", ":")
        ),
        ANN_PREEMPTIONS: json.dumps(
            {p: [round(t, 3) for t in ts] for p, ts in sorted(windows.items())},
            separators=(",", ":"),
        ),
        ANN_DEFRAGS: json.dumps(
            {p: [round(t, 3) for t in ts] for p, ts in sorted((defrags or {}).items())},
            separators=(",", ":"),
        ),
        ANN_FAIR_SHARE: json.dumps(
            {"at": round(at, 3), "usage": {q: round(v, 3) for q, v in sorted(usage.items())}},
            separators=(",", ":"),
        ),
    }


class StateRecord:
    def __init__(
        self, api: KubeApi, namespace: str, name: str, *, usage_every_s: float = 30.0
    ) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.usage_every_s = usage_every_s
        self.writes = 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="state")
        self._lock = threading.Lock()
        self._written: tuple[object, ...] | None = None
        self._usage_at = -math.inf
        self._broken = False  # said once; the scheduler goes on without the record

    def load(self) -> Saved:
        try:
            found = self.api.get_raw(self.path)
        except Exception as exc:
            self._say(f"cannot read it: {exc}")
            return Saved({}, None, 0.0)
        meta = found.get("metadata") if found else None
        annotations = meta.get("annotations") if isinstance(meta, dict) else None
        saved = decode(annotations if isinstance(annotations, dict) else {})
        self._written = (dict(saved.windows), saved.awaiting, dict(saved.defrags))
        return saved

    def maybe_save(
        self,
        windows: Windows,
        usage: Mapping[str, float],
        now: float,
        awaiting: Mapping[str, tuple[str, int]] | None = None,
        defrags: Windows | None = None,
    ) -> None:
        """Queue a write when the budget windows (incident and MIG defrag) or the requeued jobs
        changed, or fair share is due."""
        state = (dict(windows), dict(awaiting or {}), dict(defrags or {}))
        with self._lock:
            if self._written == state and now - self._usage_at < self.usage_every_s:
                return
            self._written, self._usage_at = state, now
        body = encode(windows, usage, now, awaiting, defrags)
        self._pool.submit(self._write, body)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _write(self, annotations: dict[str, str]) -> None:
        try:
            current = self.api.get_raw(self.path)
            if current is None:
                lease = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": self.name,
                        "namespace": self.namespace,
                        "annotations": annotations,
                    },
                    "spec": {},
                }
                collection = self.path.rsplit("/", 1)[0]
                self.api.write_raw("POST", collection, lease)
            else:
                meta = dict(current.get("metadata") or {})  # type: ignore[call-overload]
                meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
                self.api.write_raw("PUT", self.path, {**current, "metadata": meta})
            self.writes += 1
        except CallFailed as exc:  # (tried again with fair share's next write)
            self._say(f"{exc.code}: {exc.message}")
        except Exception as exc:
            self._say(str(exc))

    def _say(self, why: str) -> None:
        if not self._broken:
            self._broken = True
            log.error(
                "state record %s/%s (incident and MIG defrag budgets, fair share kept across "
                "restarts): %s; "
                "a restart will start with whole budgets (grant get, update on this Lease and "
                "create leases in %s: deploy/02-rbac.yaml)",
                self.namespace,
                self.name,
                why,
                self.namespace,
            )
