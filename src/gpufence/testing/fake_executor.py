"""An in-memory ``Executor`` for control-plane unit tests: no processes, everything recorded.

It implements ``control/executors/interface.Executor``. Every call the control plane makes is
appended to ``calls`` (in order) and to a list per kind (``launches``, ``notices``, ``stops``,
``adopts``); ``on_start`` / ``on_notice`` / ``on_stop`` hooks run *inside* the call, so a test can
look at the store at the moment the executor is asked to act (the reconciler persists a decision
before acting on it). The test plays the processes:

* ``exit(job, attempt, codes)`` reports an attempt's end through ``on_exit`` (as the watcher
  thread of a real executor would; ``stopped`` is set when ``stop()`` was called for it);
* ``ack(job, attempt)`` reports a checkpoint acknowledgement; ``node(name, up)`` a node change;
* ``fail_start[job_id] = "why"`` makes ``start()`` raise ``LaunchError("why")``;
* ``adopt_results[(job, attempt)]`` says what ``adopt()`` finds after a restart: ``True`` (still
  running), a tuple of exit codes (it ended while the plane was down, with exit records), or
  ``None`` (lost: no exit record). A gone attempt reports its exit at once, as the local
  executor's watcher does. Attempts not listed are lost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpufence.control.base.executor import (
    AckCallback,
    AttemptExit,
    ExitCallback,
    Launch,
    LaunchError,
    NodeCallback,
)

Key = tuple[str, int]
AdoptResult = bool | tuple[int | None, ...] | None


@dataclass(frozen=True, slots=True)
class NoticeCall:
    job_id: str
    attempt: int
    reason: str
    deadline_unix: float
    signal_job: bool


@dataclass(frozen=True, slots=True)
class StopCall:
    job_id: str
    attempt: int
    grace_s: float


@dataclass
class FakeExecutor:
    """See the module docstring. Not thread-safe: tests drive it from one thread."""

    adopt_results: dict[Key, AdoptResult] = field(default_factory=dict)
    adopt_stop_reached: dict[Key, bool] = field(default_factory=dict)
    """For an attempt that ``adopt`` finds ended: its exit's ``stop_reached`` (None if absent)."""
    fail_start: dict[str, str] = field(default_factory=dict)
    activity_sample: dict[Key, float] = field(default_factory=dict)
    """What ``activity()`` returns (CPU utilisation per running attempt)."""
    on_start: Callable[[Launch], None] | None = None
    on_notice: Callable[[NoticeCall], None] | None = None
    on_stop: Callable[[StopCall], None] | None = None

    calls: list[str] = field(default_factory=list)
    """``"start j1/1"``, ``"notice j1/1"``, ``"stop j1/1"``, ``"adopt j1/1"``, ``"exit j1/1"``..."""
    launches: list[Launch] = field(default_factory=list)
    notices: list[NoticeCall] = field(default_factory=list)
    stops: list[StopCall] = field(default_factory=list)
    adopts: list[Launch] = field(default_factory=list)
    closed: bool | None = None
    """None while open; the ``kill`` flag of ``close()`` after it."""
    _running: dict[Key, Launch] = field(default_factory=dict)
    _stopped: set[Key] = field(default_factory=set)
    _on_exit: ExitCallback | None = None
    _on_ack: AckCallback | None = None
    _on_node: NodeCallback | None = None

    # ------------------------------------------------------------------ the Executor protocol
    def set_callbacks(self, on_exit: ExitCallback, on_ack: AckCallback) -> None:
        self._on_exit, self._on_ack = on_exit, on_ack

    def set_node_callback(self, on_node: NodeCallback) -> None:
        self._on_node = on_node

    def start(self, launch: Launch) -> None:
        key = (launch.job_id, launch.attempt)
        self.calls.append(f"start {_k(key)}")
        if self.on_start is not None:
            self.on_start(launch)
        why = self.fail_start.get(launch.job_id)
        if why is not None:
            raise LaunchError(why)
        self.launches.append(launch)
        self._running[key] = launch

    def notice(
        self, job_id: str, attempt: int, reason: str, deadline_unix: float, signal_job: bool = True
    ) -> None:
        call = NoticeCall(job_id, attempt, reason, deadline_unix, signal_job)
        self.calls.append(f"notice {_k((job_id, attempt))}")
        if self.on_notice is not None:
            self.on_notice(call)
        self.notices.append(call)

    def stop(self, job_id: str, attempt: int, grace_s: float) -> None:
        call = StopCall(job_id, attempt, grace_s)
        self.calls.append(f"stop {_k((job_id, attempt))}")
        if self.on_stop is not None:
            self.on_stop(call)
        self.stops.append(call)
        self._stopped.add((job_id, attempt))

    def adopt(self, launch: Launch) -> bool:
        key = (launch.job_id, launch.attempt)
        self.calls.append(f"adopt {_k(key)}")
        self.adopts.append(launch)
        found = self.adopt_results.get(key)
        if found is True:
            self._running[key] = launch
            return True
        codes = found if isinstance(found, tuple) else (None,) * len(launch.members)
        self._running[key] = launch
        self.exit(
            launch.job_id, launch.attempt, codes, stop_reached=self.adopt_stop_reached.get(key)
        )
        return False

    def running(self) -> list[Key]:
        return list(self._running)

    def activity(self) -> dict[Key, float]:
        return {k: v for k, v in self.activity_sample.items() if k in self._running}

    def close(self, kill: bool = False) -> None:
        self.calls.append(f"close kill={kill}")
        self.closed = kill

    # ------------------------------------------------------- the test plays the processes
    def exit(
        self,
        job_id: str,
        attempt: int = 1,
        codes: tuple[int | None, ...] = (0,),
        strict: bool = True,
        before_stop: bool = False,
        stop_reached: bool | None = None,
    ) -> None:
        """Report that the attempt ended with ``codes`` (one per rank). ``strict=False`` also
        reports an attempt that is not running (a duplicate or stale report, which a real
        executor never sends: for tests of the reconciler's guard against them).
        ``before_stop``: the exit was seen before a stop was asked of it, and reaches the
        reconciler after it decided the stop (an exit racing a stop). ``stop_reached``: what
        the launchers' records say of the stop signal (None: no such records)."""
        key = (job_id, attempt)
        if strict and key not in self._running:
            raise AssertionError(f"{_k(key)} is not running in the fake executor")
        self._running.pop(key, None)
        self.calls.append(f"exit {_k(key)}")
        ev = AttemptExit(
            job_id,
            attempt,
            succeeded=bool(codes) and all(c == 0 for c in codes),
            codes=codes,
            stopped=key in self._stopped and not before_stop,
            stop_reached=stop_reached,
        )
        assert self._on_exit is not None, "set_callbacks was never called"
        self._on_exit(ev)

    def ack(self, job_id: str, attempt: int = 1) -> None:
        """Report that the attempt acknowledged its notice (its checkpoint is written)."""
        assert self._on_ack is not None, "set_callbacks was never called"
        self.calls.append(f"ack {_k((job_id, attempt))}")
        self._on_ack(job_id, attempt)

    def node(self, name: str, up: bool) -> None:
        assert self._on_node is not None, "set_node_callback was never called"
        self._on_node(name, up)

    def is_running(self, job_id: str, attempt: int = 1) -> bool:
        return (job_id, attempt) in self._running


def _k(key: Key) -> str:
    return f"{key[0]}/{key[1]}"
