"""Crash recovery in the core: JobRestored puts a running job back exactly where it runs."""

from __future__ import annotations

import pytest

from gpufence.model.decisions import Assignment, Bind, Reason, Requeue
from gpufence.model.events import JobRestored, JobStopped, JobSubmitted
from gpufence.sched.jobs import JobState
from gpufence.sched.restore import RestoreConflict
from gpufence.sched.scheduler import Scheduler, SchedulerConfig
from gpufence.testing.builders import ClusterBuilder, PreemptionMode, PreemptionPolicy, job


def _cluster() -> object:
    return ClusterBuilder().nodes("n", 1, gpus=4).partition("p", groups=["n"]).build()


def _sched() -> Scheduler:
    return Scheduler(_cluster(), SchedulerConfig(validate=True))  # type: ignore[arg-type]


def test_restored_gpus_are_not_given_to_new_jobs() -> None:
    s = _sched()
    running = job("old").gpus(2).build()
    restored = JobRestored(running, "p", (Assignment(node=0, gpus=(0, 1)),), attempt=3)
    out = s.step([restored, JobSubmitted(job("new").gpus(2).build())], now=10.0)
    binds = [d for d in out if isinstance(d, Bind)]
    assert [(b.job_id, b.assignments[0].gpus) for b in binds] == [("new", (2, 3))]
    assert s.job("old").state is JobState.RUNNING
    assert s.job("old").attempt == 3
    out = s.step([JobSubmitted(job("third").gpus(1).build())], now=11.0)
    assert not [d for d in out if isinstance(d, Bind)]


def test_restored_stopping_job_requeues_when_stopped() -> None:
    s = _sched()
    j = job("g").gpus(4).checkpointable().build()
    ev = JobRestored(
        j,
        "p",
        (Assignment(node=0, gpus=(0, 1, 2, 3)),),
        stopping=Reason.INCIDENT_PREEMPTION,
        requeue=True,
    )
    assert s.step([ev], now=1.0) == []
    out = s.step([JobStopped("g")], now=2.0)
    assert any(isinstance(d, Requeue) for d in out)
    assert any(isinstance(d, Bind) and d.job_id == "g" for d in out)


@pytest.mark.parametrize(
    ("assignments", "needle"),
    [
        ((Assignment(node=0, gpus=(0, 9)),), "GPU 9 does not exist"),
        ((Assignment(node=0, gpus=(0,)), Assignment(node=0, gpus=(1,))), "assignments for"),
    ],
)
def test_impossible_restore_is_refused(assignments: tuple[Assignment, ...], needle: str) -> None:
    s = _sched()
    with pytest.raises(RestoreConflict, match=needle):
        s.step([JobRestored(job("x").gpus(2).build(), "p", assignments)], now=1.0)


def test_double_booking_on_restore_is_refused() -> None:
    s = _sched()
    a = JobRestored(job("a").gpus(1).build(), "p", (Assignment(node=0, gpus=(0,)),))
    b = JobRestored(job("b").gpus(1).build(), "p", (Assignment(node=0, gpus=(0,)),))
    with pytest.raises(RestoreConflict, match="already held by a"):
        s.step([a, b], now=1.0)


def test_restored_job_on_incident_capacity_is_not_charged_to_its_queue() -> None:
    c = (
        ClusterBuilder()
        .nodes("s", 1, gpus=2)
        .nodes("t", 1, gpus=2)
        .partition(
            "serve",
            ["s"],
            preemption=PreemptionPolicy(PreemptionMode.INCIDENT_ONLY, from_partitions=("train",)),
        )
        .partition("train", ["t"])
        .build()
    )
    s = Scheduler(c, SchedulerConfig(validate=True))
    j = job("sv").gpus(1).cls("serving").partition("serve").build()
    s.step([JobRestored(j, "train", (Assignment(node=1, gpus=(2,)),))], now=1.0)
    assert s.ledger.allocs["sv"].incident
    assert s.ledger.queue_used["serve"] == 0
