"""Discrete-event engine: a heap of (time, sequence, event) with a virtual clock.

The sequence number breaks ties in insertion order, so a run is deterministic for its inputs.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class EventQueue(Generic[T]):
    now: float = 0.0
    _heap: list[tuple[float, int, T]] = field(default_factory=list)
    _seq: int = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, at: float, item: T) -> None:
        if at < self.now:
            raise ValueError(f"cannot schedule at {at}: the clock is already at {self.now}")
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, item))

    def peek_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self) -> tuple[float, list[T]]:
        """Advance the clock to the next event time and return every event due then."""
        at = self._heap[0][0]
        self.now = at
        out: list[T] = []
        while self._heap and self._heap[0][0] == at:
            out.append(heapq.heappop(self._heap)[2])
        return at, out
