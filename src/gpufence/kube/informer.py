"""List + watch, the way every Kubernetes controller keeps a cache: a full list, then a watch
from the list's resourceVersion; when the watch breaks (the API server restarted, the
connection dropped, ``410 Gone``: our version is older than the server keeps) it lists again.
A re-list is delivered whole (``Resync``), so the consumer also learns what was deleted while
it was not watching -- lightkube's own retry would resume from "now" and lose those.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("gpufence.kube")


@dataclass(frozen=True, slots=True)
class Resync:
    """Everything of this kind that exists now (the first list, or a re-list)."""

    kind: str
    objects: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Change:
    kind: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: Any


Lister = Callable[[], tuple[list[Any], str]]
Watcher = Callable[[str], Iterator[tuple[str, Any]]]


class Informer:
    def __init__(
        self,
        kind: str,
        lister: Lister,
        watcher: Watcher,
        out: queue.Queue[Resync | Change],
        stop: threading.Event,
        *,
        backoff_s: tuple[float, float] = (0.2, 5.0),
    ) -> None:
        self.kind = kind
        self._list, self._watch, self._out, self._stop = lister, watcher, out, stop
        self._backoff = backoff_s
        self.relists = 0  # how many times the watch broke and the cache was listed again
        self.thread = threading.Thread(target=self._run, name=f"informer-{kind}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        delay = self._backoff[0]
        first = True
        while not self._stop.is_set():
            try:
                items, version = self._list()
                self._out.put(Resync(self.kind, tuple(items)))
                if not first:
                    self.relists += 1
                first = False
                delay = self._backoff[0]
                for kind, obj in self._watch(version):
                    if self._stop.is_set():
                        return
                    self._out.put(Change(self.kind, kind, obj))
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.warning("%s watch broke (%s); listing again in %.1fs", self.kind, exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, self._backoff[1])
