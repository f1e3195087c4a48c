"""The ``mig-parted`` configs gpufence names, written into the MIG manager's ConfigMap at run time.

A config describes every GPU of a node (``kube/mig_parted.py``), so a pre-installed catalogue
of every combination only fits nodes of 1 or 2 GPUs (38 ** GPUs on an H100). With
``gpufence k8s run --mig-configmap NAMESPACE/NAME`` (the ConfigMap the GPU operator's
``migManager.config.name`` points at) gpufence instead writes the one config a re-cut names into
its ``config.yaml`` *before* it labels the node:

* read-modify-update with the ConfigMap's ``resourceVersion``, read again and retried on a 409
  (another writer got in between), so configs other writers added are never dropped;
* gpufence's own configs (``gpufence-<n>gpu-<hash>``) that no node's label names any more, and
  that no re-cut in flight names, are removed in the same write: the catalogue holds what the
  nodes use, not every layout ever asked for;
* the MIG manager reads the ConfigMap through a mounted file that the kubelet refreshes on its
  sync period (a minute by default), not through the API. A label naming a config the file
  does not hold yet would fail the re-cut, so a config written less than ``settle_s`` ago is
  given that long before the label is set (the ConfigMap's ``gpufence.io/mig-configs-written``
  says when each was written, for a new leader too); a config in the ConfigMap for longer
  (another node's, an earlier re-cut's) is labelled at once.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable

import yaml

from gpufence.kube.api import CallFailed, KubeApi
from gpufence.kube.mig_parted import ConfigWrite, MigPartedError

KEY = "config.yaml"  # the key the GPU operator's MIG manager reads
OURS = re.compile(r"^gpufence-\d+gpu-[0-9a-f]{12}$")  # names kube/mig_parted.py gives
CONFLICT_TRIES = 5
# on the ConfigMap: when each of gpufence's configs was written ({config: epoch seconds})
ANN_WRITTEN = "gpufence.io/mig-configs-written"
# how long a ConfigMap volume may lag the API at worst: the kubelet's sync period (1 min by
# default) plus its ConfigMap cache's TTL (1 min): a failed state on a config written less
# than this before its label may be the file's lag, and the pod's reason says so
LAG_SUSPECT_S = 120.0


def merged(text: str, write: ConfigWrite, source: str) -> str | None:
    """``config.yaml`` with ``write``'s config in it and gpufence's unused ones out; None when
    that is what it holds already. Raises ``MigPartedError`` (naming the ConfigMap) on a file
    gpufence cannot read, rather than overwrite it."""
    try:
        data = yaml.safe_load(text) if text.strip() else {"version": "v1", "mig-configs": {}}
    except yaml.YAMLError as exc:
        raise MigPartedError(f"{source}: {KEY} is not YAML: {exc}") from None
    if isinstance(data, dict) and data.get("mig-configs") is None:
        data["mig-configs"] = {}
    if not isinstance(data, dict) or data.get("version") != "v1":
        raise MigPartedError(f"{source} {KEY}: expected a mapping with version: v1")
    configs = data["mig-configs"]
    if not isinstance(configs, dict):
        raise MigPartedError(f"{source} {KEY}: mig-configs must map config names to entries")
    # others' configs are kept as they are, not checked: they are the MIG manager's to read
    stale = [n for n in configs if OURS.match(n) and n not in write.keep and n != write.name]
    wanted = [dict(e) for e in write.items]
    if configs.get(write.name) == wanted and not stale:
        return None
    kept = {n: items for n, items in configs.items() if n not in stale}
    kept[write.name] = wanted
    out = dict(data)
    out["mig-configs"] = kept
    return yaml.safe_dump(out, sort_keys=False)


class MigConfigMap:
    """The writer; its calls run on the action runner's MIG thread, one at a time. When each
    gpufence config was written is kept on the ConfigMap itself (``ANN_WRITTEN``), so a new
    leader, or another replica, still holds a label back until the file can have it."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        *,
        settle_s: float = 70.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.path = f"/api/v1/namespaces/{namespace}/configmaps/{name}"
        self.settle_s, self.clock = settle_s, clock
        self._lock = threading.Lock()
        self._written: dict[str, float] = {}  # config -> when it was written, as last read
        self.writes = 0

    @property
    def source(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    def ensure(self, write: ConfigWrite) -> float:
        """Put the config in the ConfigMap (dropping unused gpufence configs); returns how many
        seconds to wait before the label, so the MIG manager's mounted file holds it. Raises
        ``CallFailed`` / ``MigPartedError`` with what to fix."""
        for _ in range(CONFLICT_TRIES):
            found = self.api.get_raw(self.path)
            if found is None:
                raise CallFailed(
                    404,
                    f"{self.source} not found: create it once and point the GPU operator's "
                    "migManager.config.name at it (docs/kubernetes.md, 'Dynamic MIG')",
                )
            meta = found.get("metadata")
            meta = dict(meta) if isinstance(meta, dict) else {}
            notes = meta.get("annotations")
            notes = dict(notes) if isinstance(notes, dict) else {}
            written = _times(notes.get(ANN_WRITTEN))
            data = found.get("data")
            data = dict(data) if isinstance(data, dict) else {}
            text = str(data.get(KEY, ""))
            new = merged(text, write, self.source)
            if new is None:
                return self._remember(written, write.name)
            held = set(yaml.safe_load(new)["mig-configs"])
            times = {n: t for n, t in written.items() if n in held}
            if not _holds(text, write):  # new or changed: the file has it only after a sync
                times[write.name] = self.clock()
            notes[ANN_WRITTEN] = json.dumps(times, sort_keys=True, separators=(",", ":"))
            meta["annotations"] = notes
            body = {**found, "metadata": meta, "data": {**data, KEY: new}}
            try:
                self.api.write_raw("PUT", self.path, body)  # carries the resourceVersion read
            except CallFailed as exc:
                if exc.code == 409:
                    continue  # another writer got in between: read again
                raise
            self.writes += 1
            return self._remember(times, write.name)
        raise CallFailed(409, f"{self.source}: still conflicting after {CONFLICT_TRIES} tries")

    def _remember(self, written: dict[str, float], config: str) -> float:
        with self._lock:
            self._written = written
        at = written.get(config)
        return 0.0 if at is None else max(0.0, at + self.settle_s - self.clock())

    def written_ago(self, config: str) -> float | None:
        """Seconds since ``config`` was written into the ConfigMap (None: not known)."""
        with self._lock:
            at = self._written.get(config)
        return None if at is None else self.clock() - at


def _times(value: object) -> dict[str, float]:
    """``ANN_WRITTEN``: {config: seconds since the epoch}; unreadable: nothing known."""
    try:
        raw = json.loads(value) if isinstance(value, str) else {}
        return {str(n): float(t) for n, t in raw.items()} if isinstance(raw, dict) else {}
    except (ValueError, TypeError):
        return {}


def _holds(text: str, write: ConfigWrite) -> bool:
    data = yaml.safe_load(text) if text.strip() else None
    configs = data.get("mig-configs") if isinstance(data, dict) else None
    found = configs.get(write.name) if isinstance(configs, dict) else None
    return bool(found == [dict(e) for e in write.items])
