"""Budget windows taken back after a restart: incident preemptions (sched/protect.py) and MIG
defrag stops (sched/migdefrag_stop.py) keep one time per stopped job, so one incident that
stops three jobs at once spends three slots at the same instant."""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable


def merged(held: Iterable[float], saved: Iterable[float], now: float) -> deque[float]:
    """The window after a restore: each instant counted as often as either side counts it
    (a set would keep one of three stops made together and refill two slots; a sum would
    count twice the stops a rebuild carries over that the core already holds). Saved times
    not finite or after ``now`` are not stops the core could have made: ignored."""
    ours = Counter(held)
    theirs = Counter(t for t in saved if math.isfinite(t) and t <= now)
    return deque(sorted((ours | theirs).elements()))
