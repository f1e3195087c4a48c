"""Re-rating: a running job's progress rate follows its time-slice neighbours and its links'
load while it runs, and its completion moves with it. Also: work lost at a stop is counted,
node failures included."""

from __future__ import annotations

import pytest

from gpufence.model.events import NodeDown
from gpufence.model.partition import SharingMode
from gpufence.sim.contention import TIME_SLICE_EPS, Contention
from gpufence.sim.runner import Simulation
from gpufence.sim.workloads.records import At, WorkItem
from gpufence.testing.builders import ClusterBuilder, job

S4 = 1 + (1 + TIME_SLICE_EPS) * 3  # four jobs on one GPU: 4.33
S3 = 1 + (1 + TIME_SLICE_EPS) * 2  # three: 3.22


def one_sliced_gpu():  # type: ignore[no-untyped-def]
    return (
        ClusterBuilder()
        .nodes("n", 1, gpus=1)
        .partition("ts", ["n"], sharing=SharingMode.TIME_SLICE, time_slice_max=4)
        .build()
    )


def test_the_issues_example_alone_then_three_neighbours() -> None:
    """Job a (1,000 s solo) starts alone; three long jobs join its GPU at 100 s. Fixed at bind
    time it would end at 1,000 s; re-rated: 100 + 900 x 4.33 = 3,997 s. Its neighbours then
    speed up to 3 per GPU: they end at 3,997 + (2,000 − 900) x 3.22 = 7,539 s."""
    work = [WorkItem(job("a").gpus(1).build(), 1000.0)]
    work += [WorkItem(job(n).gpus(1).at(100.0).build(), 2000.0) for n in ("b", "c", "d")]
    c = one_sliced_gpu()
    r = Simulation(c, work, slowdown=Contention(c)).run()
    assert r.jobs["a"].end == pytest.approx(100 + 900 * S4)
    assert r.jobs["a"].end == pytest.approx(3997.0)
    for n in ("b", "c", "d"):
        assert r.jobs[n].end == pytest.approx(100 + 900 * S4 + (2000 - 900) * S3)
    assert r.rerates >= 4  # a when the three joined, then the three when a left


def test_without_a_slowdown_model_jobs_run_at_solo_speed() -> None:
    work = [WorkItem(job("a").gpus(1).build(), 1000.0)]
    work += [WorkItem(job(n).gpus(1).at(100.0).build(), 2000.0) for n in ("b", "c", "d")]
    r = Simulation(one_sliced_gpu(), work).run()
    assert r.jobs["a"].end == pytest.approx(1000.0)


def test_a_node_failure_loses_the_work_since_the_last_checkpoint() -> None:
    c = ClusterBuilder().nodes("n", 1, gpus=8).partition("p", ["n"]).build()
    item = WorkItem(job("t").gpus(8).checkpointable().build(), 10_000.0, checkpoint_every_s=1000.0)
    r = Simulation(c, [item], events=[At(2500.0, NodeDown("n-0"))], slowdown=Contention(c)).run(
        until=5000.0
    )
    # checkpoints at 1,000 and 2,000 s: 500 s x 8 GPUs lost
    assert r.lost_gpu_s == [("node-failure", pytest.approx(500.0 * 8))]
    assert r.jobs["t"].done_s == pytest.approx(2000.0)
