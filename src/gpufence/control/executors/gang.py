"""The stop and gang rules every executor applies to a running attempt, in one place.

A gang is all-or-nothing while it runs too: when a member exits non-zero on its own (not after a
stop), the rest are asked to stop and get SIGKILL once the grace is over. A stop asks once
(SIGTERM) and keeps the earliest kill deadline. The local and the Ray executor differ in how they
signal and watch members, not in these rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufence.control.base.executor import AttemptExit, Launch


@dataclass(eq=False, slots=True)
class GangState:
    """Stop / notice bookkeeping of one running attempt (executors extend it with members)."""

    launch: Launch
    stop_requested: bool = False
    kill_at: float | None = None
    """Monotonic time at which the live members get SIGKILL."""
    gang_failed: bool = False
    ack_wanted: bool = False
    acked: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return (self.launch.job_id, self.launch.attempt)

    def request_stop(self, deadline: float) -> bool:
        """Record a stop with its kill deadline; True the first time (send SIGTERM then)."""
        first = not self.stop_requested
        self.stop_requested = True
        self.kill_by(deadline)
        return first

    def kill_by(self, deadline: float) -> None:
        self.kill_at = deadline if self.kill_at is None else min(self.kill_at, deadline)

    def fails_gang(self, code: int | None) -> bool:
        """A member ended with ``code``: does that bring the rest of the gang down?"""
        return code != 0 and not self.stop_requested and not self.gang_failed

    def kill_due(self, now: float) -> bool:
        """The kill deadline passed (cleared, so it fires once)."""
        if self.kill_at is not None and self.kill_at <= now:
            self.kill_at = None
            return True
        return False

    def exit_event(
        self,
        codes: tuple[int | None, ...],
        oom: bool = False,
        strays_killed: int = 0,
        stop_reached: bool | None = None,
        ended_at: float | None = None,
    ) -> AttemptExit:
        ok = bool(codes) and all(c == 0 for c in codes)
        return AttemptExit(
            self.launch.job_id,
            self.launch.attempt,
            ok,
            codes,
            self.stop_requested,
            oom=oom,
            strays_killed=strays_killed,
            stop_reached=stop_reached,
            ended_at=ended_at,
        )
