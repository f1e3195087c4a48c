"""Deadlines are immune to wall-clock steps, also across a restart (real store, real processes).

The plane's clock is injected with a wall clock the test steps (``SteppedWall``: the real one plus
an offset), as the system clock would be stepped by an operator or a broken NTP; the monotonic
clock is the real one. A step back must not stretch a time limit, a step forward must not end
a job early, and a restart after a step resumes every deadline where it was.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpufence.control.base.config import ADMIN, cluster_from_spec_dict, control_config
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.base.plane_clock import anchored
from gpufence.control.gpus.discovery import fake_gpus, node_spec
from gpufence.control.plane import ControlPlane
from gpufence.control.store import database as st
from gpufence.testing.waiting import until

DAY = 86400.0


class SteppedWall:
    """The real wall clock plus ``offset`` seconds (what a clock step does to ``time.time``)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def _plane(data: Path, wall: SteppedWall) -> ControlPlane:
    cfg = control_config({"stop_grace_s": 1}, data)
    p = ControlPlane(
        cluster_from_spec_dict(node_spec(fake_gpus(2))),
        cfg,
        fake_gpus(2),
        data,
        clock=anchored(data, wall=wall),
    )
    p.start()
    return p


def _sleeper(limit_s: float) -> SubmitRequest:
    return SubmitRequest.model_validate(
        {"command": ["sleep", "120"], "time_limit_s": limit_s, "gpus": 1}
    )


def _row(p: ControlPlane, jid: str) -> st.JobRow:
    row = p.job(jid, ADMIN)
    assert row is not None
    return row


def _running(p: ControlPlane, jid: str) -> None:
    until(lambda: _row(p, jid).state == st.RUNNING, 30, f"{jid} running")


def test_a_wall_clock_step_neither_stretches_nor_cuts_a_time_limit(tmp_path: Path) -> None:
    wall = SteppedWall()
    p = _plane(tmp_path / "data", wall)
    try:
        short = p.submit(_sleeper(3), ADMIN).job_id
        long = p.submit(_sleeper(3600), ADMIN).job_id
        _running(p, short)
        _running(p, long)
        t0 = time.monotonic()
        wall.offset = -3600.0  # stepped back an hour: the 3 s limit must still end it
        until(lambda: _row(p, short).state == st.FAILED, 15, f"{short} ended at its limit")
        assert time.monotonic() - t0 < 8, "the limit was stretched by the step"
        assert _row(p, short).reason == "time-limit"
        wall.offset = DAY  # stepped forward a day: the 1 h limit is not reached
        time.sleep(2.5)
        assert _row(p, long).state == st.RUNNING, _row(p, long)
    finally:
        p.close(kill_jobs=True)


@pytest.mark.slow
def test_a_restart_after_a_step_resumes_every_deadline(tmp_path: Path) -> None:
    wall = SteppedWall()
    data = tmp_path / "data"
    p = _plane(data, wall)
    try:
        long = p.submit(_sleeper(3600), ADMIN).job_id
        short = p.submit(_sleeper(6), ADMIN).job_id
        _running(p, long)
        _running(p, short)
        t0 = time.monotonic()
    finally:
        p.close()  # the jobs keep running: adopted by the next start
    wall.offset = DAY  # while it was down, the clock jumped a day ahead
    p = _plane(data, wall)
    try:
        time.sleep(1.0)
        assert _row(p, long).state == st.RUNNING, "a 1 h limit ended by a clock step"
        until(lambda: _row(p, short).state == st.FAILED, 20, f"{short} ended at its limit")
        assert time.monotonic() - t0 >= 5.0, "the 6 s limit was cut short"
        assert _row(p, short).reason == "time-limit"
    finally:
        p.close(kill_jobs=True)
    wall.offset = -3600.0  # and back an hour below the first start: the anchor still holds
    p = _plane(data, wall)
    try:
        ended = _row(p, short).ended_at
        assert ended is not None and p.now() >= ended, "the plane's time went back with the wall"
    finally:
        p.close(kill_jobs=True)
