"""Nodes closed to new work by an operator: drains and maintenance windows.

A node takes new work when it is healthy (the front end's ``NodeUp`` / ``NodeDown``), not
drained, and not inside a maintenance window; the ledger's ``node_up`` is that conjunction, so
every placer, reservation and measure that skips a down node skips a closed one the same way
(``sync``). A window that has not begun yet closes its nodes only to the jobs that could still
run when it begins -- those whose time limit does not end by its start, and every job without
one (``closed_for``) --, which the placement engine applies per job in a ledger fork
(``sched/placement/dispatch.py``): whether a node takes a job then depends on the job, so it
cannot be a flag of the node.

Times are the core's clock (the ``now`` of ``Scheduler.step``); nothing here reads one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufence.model.cluster import Cluster
from gpufence.state.ledger import Ledger

INF = float("inf")


@dataclass(frozen=True, slots=True)
class Drain:
    reason: str
    deadline: float | None  # running work is stopped by then (None: it finishes)


@dataclass(frozen=True, slots=True)
class Window:
    window_id: str
    nodes: tuple[int, ...]
    start: float
    end: float
    reason: str

    def active(self, now: float) -> bool:
        return self.start <= now < self.end

    def overlaps(self, now: float, limit: float | None) -> bool:
        """A job started ``now`` with time limit ``limit`` (None: unbounded) would still run
        when the window begins (and the window has not ended)."""
        if now >= self.end:
            return False
        return limit is None or now + limit > self.start


def when(t: float) -> str:
    """A core time for a message: small times as the scenarios write them (t=100), plane-clock
    readings (Unix-like, as the control plane's) as a UTC date an operator can read."""
    return f"t={t:g}" if abs(t) < 1e8 else utc(t)


def utc(t: float) -> str:
    """``t`` seconds after the Unix epoch as "YYYY-MM-DD HH:MM:SS UTC", by the proleptic
    Gregorian calendar (Howard Hinnant's days-to-civil), since the core imports no datetime."""
    days, secs = divmod(int(t), 86400)
    hh, rest = divmod(secs, 3600)
    mm, ss = divmod(rest, 60)
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    return f"{year:04d}-{month:02d}-{day:02d} {hh:02d}:{mm:02d}:{ss:02d} UTC"


@dataclass(slots=True)
class NodeClosures:
    cluster: Cluster
    drained: dict[int, Drain] = field(default_factory=dict)
    windows: dict[str, Window] = field(default_factory=dict)
    down: set[int] = field(default_factory=set)  # reported failed or cordoned (NodeDown)
    now: float = 0.0
    version: int = 0  # bumped by every change (the placement engine keys its cache on it)

    def closed_now(self, node: int) -> bool:
        return node in self.drained or any(
            w.active(self.now) and node in w.nodes for w in self.windows.values()
        )

    def takes_work(self, node: int) -> bool:
        return node not in self.down and not self.closed_now(node)

    def sync(self, ledger: Ledger, nodes: list[int] | tuple[int, ...]) -> None:
        """Make the ledger's ``node_up`` of ``nodes`` say whether they take work now."""
        for n in nodes:
            want = self.takes_work(n)
            if ledger.node_up[n] != want:
                ledger.set_node_up(n, want)

    def closed_for(self, limit: float | None, pool_nodes: tuple[int, ...]) -> tuple[int, ...]:
        """Of ``pool_nodes``, those a job with time limit ``limit`` may not start on now
        because a window that has not begun yet would find it running (nodes closed now are
        already down in the ledger and not listed)."""
        if not self.windows:
            return ()
        now = self.now
        shut: set[int] = set()
        for w in self.windows.values():
            if now < w.start and w.overlaps(now, limit):
                shut.update(w.nodes)
        return tuple(
            n for n in pool_nodes if n in shut and n not in self.down and not self.closed_now(n)
        )

    def opened(self, pool_nodes: tuple[int, ...]) -> tuple[int, ...]:
        """Of ``pool_nodes``, the healthy ones closed now by a drain or a window."""
        return tuple(n for n in pool_nodes if n not in self.down and self.closed_now(n))

    def describe(self, nodes: tuple[int, ...]) -> str:
        """Why ``nodes`` are closed: each drain, then each window, in a pending reason."""
        names = self.cluster.nodes
        nodes = tuple(sorted(set(nodes)))
        parts = [
            f"node {names[n].name} drained: {self.drained[n].reason}"
            for n in nodes
            if n in self.drained
        ]
        wanted = set(nodes)
        for wid in sorted(self.windows):
            w = self.windows[wid]
            if wanted.isdisjoint(w.nodes):
                continue
            on = ",".join(names[n].name for n in w.nodes)
            text = f"maintenance {wid} on {on} from {when(w.start)} for {w.end - w.start:g} s"
            parts.append(f"{text}: {w.reason}" if w.reason else text)
        return "; ".join(parts)

    def next_edge(self) -> float | None:
        """The next time a window begins or ends (when nodes close or open again)."""
        times = [t for w in self.windows.values() for t in (w.start, w.end) if t > self.now]
        return min(times) if times else None
