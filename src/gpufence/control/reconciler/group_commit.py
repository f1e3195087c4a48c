"""Group commit: how long the reconciler waits for a request's neighbours before one commit.

A submit is acknowledged only after a durable commit (an fsync), and every cycle also costs a
scheduling step: requests that arrive together should share both. So the first request of a
cycle waits for the ones its neighbours are about to send, at most ``window_s``. The wait ends
early once as many requests are queued as the last batch held (``target``): with N clients in
a closed loop the N requests of a round arrive within a fraction of a millisecond, and waiting
the whole window after the last of them was pure latency (2 ms of the ~10 ms a round took on 2
cores: bench/submit_load.py). One request at a time (an interactive ``gpufence submit``) then
waits nothing at all.

``target`` follows the load: it is the size of the last batch, so a wait that ends by the
window sets it to what did arrive (fewer clients now) and a batch that found more queued than
expected raises it. It only shapes *when* a cycle starts; what a cycle does with its batch,
and every durability promise, is the reconciler's.

The waiting side sleeps on an ``Event`` set once per batch by the request that completes it,
not on the inbox itself: waking the reconciler for every request put meanwhile would take the
GIL from the HTTP thread that is parsing the next one (batches of 5-6 instead of 7-8, and
more CPU per submit).
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class GroupCommit:
    """The gather of one reconciler: ``arrived`` on the request side, ``wait`` on its own."""

    def __init__(self, window_s: float, max_items: int) -> None:
        self.window_s = window_s
        self.max_items = max_items
        self.target = 1
        """How many requests a batch is expected to hold: the last batch's size."""
        self._full = threading.Event()
        self._waiting = False

    def arrived(self, queued: Callable[[], int]) -> None:
        """A request was put in the inbox (``queued``: how many are in it now)."""
        # the waiter sets _waiting before it counts the queue, a request counts after its put:
        # whichever comes second sees the other, so no batch waits out a window it filled
        if self._waiting and queued() + 1 >= self.target:
            self._full.set()

    def wait(self, queued: Callable[[], int]) -> bool:
        """Called with the first request of a batch taken (``queued``: how many more are
        waiting): returns once ``target`` are there (True), or after ``window_s`` (False)."""
        self._full.clear()
        self._waiting = True
        try:
            return queued() + 1 >= self.target or self._full.wait(self.window_s)
        finally:
            self._waiting = False

    def taken(self, n: int) -> None:
        """The batch held ``n`` requests: the next one is expected to hold as many."""
        self.target = max(1, min(n, self.max_items))
