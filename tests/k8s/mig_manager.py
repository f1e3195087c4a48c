"""A fake GPU operator MIG manager for the Kubernetes tests, played against the real API server.

It watches its nodes as the real one does and reacts to a new ``nvidia.com/mig.config`` label:
``nvidia.com/mig.config.state=pending``, then (after ``delay_s``, or once ``release()`` is called
in ``hold`` mode) it looks the config up in the ``mig-parted`` file it was given: found, it sets
the node's allocatable ``nvidia.com/mig-<profile>`` counts to the config's (the device plugin's
part, "mixed" strategy) and then the state ``success``; not found, or in ``fail`` mode, the
state ``failed``. In ``lag`` mode it reports ``success`` first and advertises the new
instances only once ``release()`` is called (a device plugin slow to restart). It interprets
the file itself (devices ``all`` or indices, ``mig-devices`` counts), not through gpufence's
code.

Given ``configmap="namespace/name"`` it reads the file from that ConfigMap's ``config.yaml``
through the API instead, as the real one reads its mounted copy -- and with ``file_lag_s`` it
sees the ConfigMap as it was that long ago (a poll of the API every 0.1 s keeps the history),
as the kubelet refreshes a ConfigMap volume only on its sync period.

Every change it sees on a node is logged in order (``log[node]``): the re-cut written (config
label and gpufence's note), each state, each new set of MIG instances -- the exact sequence of
writes the tests assert. Watches are ``?watch=1&timeoutSeconds=1`` requests chained by
resourceVersion, so no event is missed between them.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from typing import Any

import kobjects as k
import yaml
from cluster import KubeCluster

CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"
NOTE = "gpufence.io/mig-recut"
MIG = "nvidia.com/mig-"
MERGE = "application/merge-patch+json"


def _mig_of(node: dict[str, Any]) -> dict[str, str]:
    alloc = (node.get("status") or {}).get("allocatable") or {}
    return {k: v for k, v in alloc.items() if k.startswith(MIG) and v != "0"}


class FakeMigManager:
    def __init__(
        self,
        kc: KubeCluster,
        configs: dict[str, Any],
        *,
        delay_s: float = 1.0,
        mode: str = "ok",
        configmap: str = "",
        file_lag_s: float = 0.0,
    ) -> None:
        self.kc, self.configs, self.delay_s, self.mode = kc, configs, delay_s, mode
        self.configmap, self.file_lag_s = configmap, file_lag_s
        self._history: list[tuple[float, dict[str, Any]]] = []  # (seen at, the file)
        self.log: dict[str, list[dict[str, Any]]] = {}
        self._seen: dict[str, dict[str, Any]] = {}
        self._released = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def watch(self, node: str) -> None:
        status, body = self.kc.request("GET", f"/api/v1/nodes/{node}")
        assert status == 200, body
        self.log[node] = []
        self._seen[node] = self._fields(body)
        rv = body["metadata"]["resourceVersion"]
        t = threading.Thread(target=self._watch, args=(node, rv), daemon=True)
        t.start()
        self._threads.append(t)

    def start_file(self) -> None:
        """``configmap`` with ``file_lag_s``: start keeping the ConfigMap's history."""
        t = threading.Thread(target=self._poll_file, daemon=True)
        t.start()
        self._threads.append(t)

    def _poll_file(self) -> None:
        while not self._stop.wait(0.1):
            found = self._read_configmap()
            with self._lock:
                self._history.append((time.monotonic(), found))

    def _read_configmap(self) -> dict[str, Any]:
        ns, name = self.configmap.split("/")
        status, body = self.kc.request("GET", f"/api/v1/namespaces/{ns}/configmaps/{name}")
        if status != 200:
            return {}
        return dict(yaml.safe_load((body.get("data") or {}).get("config.yaml") or "{}") or {})

    def _file(self) -> dict[str, Any]:
        """The mig-parted file as the MIG manager sees it now."""
        if not self.configmap:
            return self.configs
        if not self.file_lag_s:
            return self._read_configmap()
        then = time.monotonic() - self.file_lag_s
        with self._lock:
            seen = [f for at, f in self._history if at <= then]
        return seen[-1] if seen else {}

    def release(self) -> None:
        """``hold`` mode: let the re-cuts held in ``pending`` go on."""
        self._released.set()

    def close(self) -> None:
        self._stop.set()
        self._released.set()
        for t in self._threads:
            t.join(timeout=5)

    def writes(self, node: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.log[node])

    # -- the watch ------------------------------------------------------------------------------

    @staticmethod
    def _fields(node: dict[str, Any]) -> dict[str, Any]:
        meta = node["metadata"]
        labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
        return {
            "config": labels.get(CONFIG),
            "state": labels.get(STATE),
            "note": notes.get(NOTE),
            "mig": _mig_of(node),
        }

    def _watch(self, node: str, rv: str) -> None:
        selector = urllib.parse.quote(f"metadata.name={node}")
        while not self._stop.is_set():
            path = (
                f"/api/v1/nodes?watch=1&timeoutSeconds=1&fieldSelector={selector}"
                f"&resourceVersion={rv}"
            )
            status, raw = self.kc.request_raw("GET", path, timeout=10)
            if status != 200:
                continue
            for line in raw.decode().splitlines():
                if not line.strip():
                    continue
                ev = json.loads(line)
                obj = ev["object"]
                if ev["type"] == "ERROR":
                    continue
                rv = obj["metadata"]["resourceVersion"]
                self._changed(node, self._fields(obj), obj)

    def _changed(self, node: str, now: dict[str, Any], obj: dict[str, Any]) -> None:
        before = self._seen[node]
        diff = {k: v for k, v in now.items() if before.get(k) != v}
        self._seen[node] = now
        if not diff:
            return
        if "note" in diff:
            diff["note"] = json.loads(diff["note"])["at"] if diff["note"] else None
        with self._lock:
            self.log[node].append(diff)
        if "config" in diff and now["config"]:
            gpus = int(obj["metadata"]["labels"].get("nvidia.com/gpu.count", "1"))
            threading.Thread(
                target=self._apply, args=(node, now["config"], gpus), daemon=True
            ).start()

    # -- applying a config ----------------------------------------------------------------------

    def _label(self, node: str, state: str) -> None:
        body = {"metadata": {"labels": {STATE: state}}}
        self.kc.request("PATCH", f"/api/v1/nodes/{node}", body, content_type=MERGE)

    def _apply(self, node: str, config: str, gpus: int) -> None:
        file = self._file()  # read when the label changes, as mig-parted's apply does
        self._label(node, "pending")
        if self.mode == "hold":
            self._released.wait()
        elif self._stop.wait(self.delay_s):
            return
        counts = None if self.mode == "fail" else self._counts(file, config, gpus)
        if counts is None:
            self._label(node, "failed")
            return
        if self.mode == "lag":  # success reported before the device plugin advertises the cut
            self._label(node, "success")
            self._released.wait()
        self._advertise(node, counts)
        if self.mode != "lag":
            self._label(node, "success")

    def _advertise(self, node: str, counts: dict[str, int]) -> None:
        body = k.ok(self.kc, "GET", f"/api/v1/nodes/{node}")
        alloc = dict(body["status"]["allocatable"])
        res: dict[str, Any] = {k: None for k in alloc if k.startswith(MIG)}
        res.update({f"{MIG}{p}": str(n) for p, n in counts.items()})
        patch = {"status": {"allocatable": res, "capacity": res}}
        self.kc.request("PATCH", f"/api/v1/nodes/{node}/status", patch, content_type=MERGE)

    @staticmethod
    def _counts(file: dict[str, Any], config: str, gpus: int) -> dict[str, int] | None:
        entries = (file.get("mig-configs") or {}).get(config)
        if entries is None:
            return None  # the real one fails on a config its file lacks
        out: dict[str, int] = {}
        for e in entries:
            devices = range(gpus) if e["devices"] == "all" else e["devices"]
            for _ in devices:
                for profile, n in (e.get("mig-devices") or {}).items():
                    out[profile] = out.get(profile, 0) + int(n)
        return out
