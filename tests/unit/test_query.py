"""The read-only query surface (sched/query.py) that views and timelines use."""

from __future__ import annotations

from gpufence.model.events import JobSubmitted
from gpufence.model.job import WorkloadClass as W
from gpufence.sched.query import GpuUse, Holding, MigSlot, PendingJob, PoolUse, ReservationView
from gpufence.sched.scheduler import Scheduler, SchedulerConfig
from gpufence.testing.builders import ClusterBuilder, MigConfig, SharingMode, job


def _sched() -> Scheduler:
    c = (
        ClusterBuilder()
        .nodes("t", 2, gpus=4)
        .nodes("m", 1, gpus=1, gpu_type="A100-40GB")
        .partition("train", ["t"])
        .partition(
            "nb",
            ["m"],
            sharing=SharingMode.MIG,
            mig=MigConfig(layout=("3g.20gb", "3g.20gb")),
        )
        .build()
    )
    return Scheduler(c, SchedulerConfig(validate=True))


def test_answers_are_plain_snapshots_of_the_state() -> None:
    s = _sched()
    jobs = [
        job("a").gpus(3).build(),
        job("b").gpus(3).build(),
        job("g").gang(2, gpus=4).est(100.0).build(),  # waits for both nodes: reserves them
        job("n").mig("3g.20gb").cls("interactive").partition("nb").build(),
    ]
    s.step([JobSubmitted(j) for j in jobs], 0.0)
    q = s.query
    assert q.gpu(0) == GpuUse(0, ("a",), 0, True, None)
    assert q.gpu(3) == GpuUse(3, (), 0, True, None)  # held for the gang: not a job's
    slots = (MigSlot("3g.20gb", 4, "n"), MigSlot("3g.20gb", 0, None))  # plan_layout order
    assert q.gpu(8) == GpuUse(8, ("n",), 0, True, slots)
    assert q.pool("train") == PoolUse("train", 6000, 2, 0, 0, 1)
    assert list(q.pending()) == [PendingJob("g", W.TRAINING, "train", "train")]
    assert [h.job_id for h in q.holdings()] == ["a", "b", "n"]
    assert next(q.holdings()) == Holding("a", W.TRAINING, "train", "train", 3000, 3, None)
    res = q.reservation("train")
    assert isinstance(res, ReservationView) and res.job_id == "g" and len(res.gpus) == 8
    assert q.reservation("nb") is None
    assert q.node_up(0)
