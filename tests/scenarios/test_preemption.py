"""Serving protection: a serving job its fence cannot hold reclaims lent capacity first, then
preempts per policy (incident-only: checkpointable victims in ``from_partitions``, lowest
priority, least work lost, never younger than min_runtime_s, within the budget per window;
on-demand: no budget, any non-serving victim past the minimum runtime). Handshake: Notice ->
CheckpointAck or grace deadline -> Stop -> JobStopped -> Requeue (attempt + 1); the serving
job then binds with reason ``incident``."""

from __future__ import annotations

import pytest
from scenario_harness import (
    A,
    CheckpointAck,
    CheckpointWritten,
    JobFinished,
    JobStopped,
    Tick,
    flat,
    make,
    sub,
)

from gpufence.model.decisions import Bind, Notice, PendingReason, Reason, Requeue, Stop
from gpufence.model.events import JobRestored, PreemptionsRestored
from gpufence.model.job import WorkloadClass as W
from gpufence.sched.jobs import JobState
from gpufence.sched.scheduler import Scheduler
from gpufence.testing.builders import (
    ClusterBuilder,
    LendingRule,
    PreemptionMode,
    PreemptionPolicy,
    job,
)

SERVING = frozenset({W.SERVING})
TRAINING = frozenset({W.TRAINING})
WHY = "serving job {} needs GPUs its fence serve cannot hold"
FREED = "on GPUs of train freed by incident preemption"


def cluster(
    mode: PreemptionMode = PreemptionMode.INCIDENT_ONLY,
    budget: int = 2,
    min_runtime: float = 600.0,
    lend: int = 0,
):  # type: ignore[no-untyped-def]
    """serve: node 0 (GPUs 0-3); train: node 1 (GPUs 4-7)."""
    pol = PreemptionPolicy(
        mode=mode,
        from_partitions=("train",),
        budget=budget,
        window_s=3600.0,
        min_runtime_s=min_runtime,
        grace_s=120.0,
    )
    lending = (LendingRule(to=("train",), cap_gpus=lend, reclaim_deadline_s=60.0),) if lend else ()
    return (
        ClusterBuilder()
        .nodes("s", 1, gpus=4)
        .nodes("t", 1, gpus=4)
        .partition("serve", ["s"], admits=SERVING, preemption=pol, lending=lending)
        .partition("train", ["t"], admits=TRAINING)
        .build()
    )


def busy(s: Scheduler, *train: tuple[str, int, int, bool]) -> None:
    """Fill serve with sv0 and start training jobs (id, gpus, priority, checkpointable) at 0.

    Higher priority binds first: with t1 (priority 0) and t2 (priority 1) of 2 GPUs each, t2
    holds GPUs 4-5 and t1 GPUs 6-7."""
    jobs = [job("sv0").gpus(4).cls("serving").build()]
    for jid, n, prio, ckpt in train:
        jobs.append(job(jid).gpus(n).priority(prio).checkpointable(ckpt).build())
    got = s.step(sub(*jobs), 0)
    assert sorted(d.job_id for d in got) == sorted(j.id for j in jobs)


def serving(jid: str, gpus: int = 2):  # type: ignore[no-untyped-def]
    return job(jid).gpus(gpus).cls("serving").build()


def test_incident_preemption_full_handshake_with_ack() -> None:
    s = make(cluster())
    busy(s, ("t1", 2, 0, True), ("t2", 2, 1, True))
    got = flat(
        s,
        [
            (1000, sub(serving("sv1"))),
            (1010, [CheckpointAck("t1")]),
            (1020, [JobStopped("t1")]),
        ],
    )
    assert got == [
        Notice("t1", Reason.INCIDENT_PREEMPTION, 1120.0, WHY.format("sv1")),
        Stop("t1", Reason.INCIDENT_PREEMPTION, True, "checkpoint acknowledged"),
        Requeue("t1", Reason.INCIDENT_PREEMPTION, 2, "back in its queue"),
        Bind("sv1", "train", (A(1, 6, 7),), Reason.INCIDENT, FREED),
    ]
    assert s.job("t1").state is JobState.PENDING and s.job("t1").attempt == 2
    assert s.counters.preemptions[Reason.INCIDENT_PREEMPTION] == 1
    assert s.ledger.allocs["sv1"].incident


def test_incident_preemption_at_grace_deadline_without_ack() -> None:
    s = make(cluster())
    busy(s, ("t1", 2, 0, True), ("t2", 2, 1, True))
    got = flat(
        s,
        [
            (1000, sub(serving("sv1"))),
            (1119, [Tick()]),
            (1120, [Tick()]),
            (1125, [JobStopped("t1")]),
        ],
    )
    assert got == [
        Notice("t1", Reason.INCIDENT_PREEMPTION, 1120.0, WHY.format("sv1")),
        Stop("t1", Reason.INCIDENT_PREEMPTION, True, "grace period expired without checkpoint ack"),
        Requeue("t1", Reason.INCIDENT_PREEMPTION, 2, "back in its queue"),
        Bind("sv1", "train", (A(1, 6, 7),), Reason.INCIDENT, FREED),
    ]


def test_victim_that_dies_during_its_notice_is_requeued_not_failed() -> None:
    # e.g. killed by the notice signal before it installed a handler: the scheduler asked it to
    # stop, so the exit is a stop, and the job comes back like any other preempted job
    s = make(cluster())
    busy(s, ("t1", 2, 0, True), ("t2", 2, 1, True))
    got = flat(s, [(1000, sub(serving("sv1"))), (1001, [JobFinished("t1", succeeded=False)])])
    assert got == [
        Notice("t1", Reason.INCIDENT_PREEMPTION, 1120.0, WHY.format("sv1")),
        Stop("t1", Reason.INCIDENT_PREEMPTION, True, "exited during its notice"),
        Requeue("t1", Reason.INCIDENT_PREEMPTION, 2, "back in its queue"),
        Bind("sv1", "train", (A(1, 6, 7),), Reason.INCIDENT, FREED),
    ]
    assert s.job("t1").state is JobState.PENDING


def test_serving_job_waits_for_preemption_and_says_so() -> None:
    s = make(cluster())
    busy(s, ("t1", 2, 0, True), ("t2", 2, 1, True))
    s.step(sub(serving("sv1")), 1000)
    assert s.why_pending("sv1") == PendingReason(
        Reason.WAITING_PREEMPTION, "waiting for t1 to stop (notice deadline t=1120)"
    )
    s.step([CheckpointAck("t1")], 1010)
    assert s.why_pending("sv1") == PendingReason(
        Reason.WAITING_PREEMPTION, "waiting for t1 to stop (stopping)"
    )


VICTIM_CASES = [
    pytest.param(
        [("t1", 2, 0, True), ("t2", 2, 1, True)],
        [],
        "t1",
        id="the lowest-priority checkpointable job is the victim",
    ),
    pytest.param(
        [("t1", 2, 0, False), ("t2", 2, 1, True)],
        [],
        "t2",
        id="a non-checkpointable job is never an incident victim",
    ),
    pytest.param(
        [("t1", 2, 0, True), ("t2", 2, 0, True)],
        [(900, [CheckpointWritten("t2")])],
        "t2",
        id="among equal priorities the job with least work lost is the victim",
    ),
    pytest.param(
        [("t1", 1, 0, True), ("t2", 3, 0, True)],
        [],
        "t2",
        id="only victims whose release lets the serving job fit are noticed",
    ),
]


@pytest.mark.parametrize(("train", "before", "victim"), VICTIM_CASES)
def test_victim_choice(train, before, victim) -> None:  # type: ignore[no-untyped-def]
    s = make(cluster())
    busy(s, *train)
    for t, evs in before:
        s.step(evs, t)
    got = s.step(sub(serving("sv1")), 1000)
    assert got == [Notice(victim, Reason.INCIDENT_PREEMPTION, 1120.0, WHY.format("sv1"))]


def test_two_victims_when_one_is_not_enough() -> None:
    s = make(cluster())
    busy(s, ("t1", 2, 0, True), ("t2", 2, 1, True))
    got = s.step(sub(serving("sv1", gpus=4)), 1000)
    assert got == [
        Notice("t1", Reason.INCIDENT_PREEMPTION, 1120.0, WHY.format("sv1")),
        Notice("t2", Reason.INCIDENT_PREEMPTION, 1120.0, WHY.format("sv1")),
    ]
    got = flat(s, [(1010, [CheckpointAck("t1"), CheckpointAck("t2")])])
    assert got == [
        Stop("t1", Reason.INCIDENT_PREEMPTION, True, "checkpoint acknowledged"),
        Stop("t2", Reason.INCIDENT_PREEMPTION, True, "checkpoint acknowledged"),
    ]
    # the serving job binds only once both have released their GPUs
    assert s.step([JobStopped("t1")], 1020) == [
        Requeue("t1", Reason.INCIDENT_PREEMPTION, 2, "back in its queue")
    ]
    assert s.step([JobStopped("t2")], 1030) == [
        Requeue("t2", Reason.INCIDENT_PREEMPTION, 2, "back in its queue"),
        Bind("sv1", "train", (A(1, 4, 5, 6, 7),), Reason.INCIDENT, FREED),
    ]


def test_jobs_younger_than_min_runtime_are_not_preempted() -> None:
    s = make(cluster(min_runtime=600.0))
    busy(s, ("t1", 2, 0, True), ("t2", 2, 1, True))
    assert s.step(sub(serving("sv1")), 599) == []
    assert s.step([Tick()], 600) == [
        Notice("t1", Reason.INCIDENT_PREEMPTION, 720.0, WHY.format("sv1"))
    ]


def test_preemption_budget_per_window() -> None:
    s = make(cluster(budget=1))
    busy(s, ("t1", 2, 0, True), ("t2", 2, 1, True))
    got = flat(
        s,
        [
            (1000, sub(serving("sv1"))),
            (1010, [CheckpointAck("t1")]),
            (1020, [JobStopped("t1")]),
        ],
    )
    assert got == [
        Notice("t1", Reason.INCIDENT_PREEMPTION, 1120.0, WHY.format("sv1")),
        Stop("t1", Reason.INCIDENT_PREEMPTION, True, "checkpoint acknowledged"),
        Requeue("t1", Reason.INCIDENT_PREEMPTION, 2, "back in its queue"),
        Bind("sv1", "train", (A(1, 6, 7),), Reason.INCIDENT, FREED),
    ]
    assert s.step(sub(serving("sv2")), 1030) == []
    why = s.why_pending("sv2")
    assert why is not None and why.reason is Reason.PREEMPTION_BUDGET
    # the window slides: one hour after the first preemption the budget is back
    assert s.step([Tick()], 4599) == []
    assert s.step([Tick()], 4600) == [
        Notice("t2", Reason.INCIDENT_PREEMPTION, 4720.0, WHY.format("sv2"))
    ]


@pytest.mark.parametrize(
    ("saved", "first_notice_at"),
    [
        ({"serve": (900.0,)}, 4500),  # spent at 900: back one window later
        ({"serve": (800.0, 900.0)}, 4500),  # over budget (a smaller one now): both must go
        ({}, 1000),  # nothing saved: the budget is whole
        ({"train": (900.0,)}, 1000),  # another partition's window
        ({"serve": (float("nan"), float("inf"), 2000.0)}, 1000),  # not preemptions made by then
    ],
)
def test_a_restored_budget_window_counts_as_if_never_restarted(
    saved: dict[str, tuple[float, ...]], first_notice_at: float
) -> None:
    """``PreemptionsRestored`` (a front end's saved windows, handed back after a restart)
    counts like preemptions made by this scheduler; values it could not have made are
    ignored."""
    s = make(cluster(budget=1))
    busy(s, ("t1", 2, 0, True), ("t2", 2, 1, True))
    restored = PreemptionsRestored(tuple(saved.items()))
    got = s.step([restored, *sub(serving("sv1"))], 1000)
    if first_notice_at == 1000:
        assert got == [Notice("t1", Reason.INCIDENT_PREEMPTION, 1120.0, WHY.format("sv1"))]
        return
    assert got == []
    why = s.why_pending("sv1")
    assert why is not None and why.reason is Reason.PREEMPTION_BUDGET
    assert s.step([Tick()], first_notice_at - 1) == []
    assert s.step([Tick()], first_notice_at) == [
        Notice("t1", Reason.INCIDENT_PREEMPTION, first_notice_at + 120.0, WHY.format("sv1"))
    ]


def test_preemption_off_leaves_serving_pending() -> None:
    s = make(cluster(mode=PreemptionMode.OFF))
    busy(s, ("t1", 2, 0, True))
    assert s.step(sub(serving("sv1")), 1000) == []
    why = s.why_pending("sv1")
    assert why is not None and why.reason is Reason.NO_FIT


def test_training_never_triggers_incident_preemption() -> None:
    s = make(cluster())
    busy(s, ("t1", 4, 0, True))
    assert s.step(sub(job("t9").gpus(2).priority(9).build()), 1000) == []


def test_on_demand_takes_young_non_checkpointable_jobs_without_budget() -> None:
    # (no minimum runtime: on demand honours it too, tests/scenarios/test_reasons_told_true.py)
    s = make(cluster(mode=PreemptionMode.ON_DEMAND, budget=0, min_runtime=0.0))
    busy(s, ("t1", 2, 0, False), ("t2", 2, 1, False))
    got = flat(
        s,
        [
            (1, sub(serving("sv1"))),
            (2, [CheckpointAck("t1")]),
            (3, [JobStopped("t1")]),
        ],
    )
    assert got == [
        Notice("t1", Reason.ON_DEMAND_PREEMPTION, 121.0, WHY.format("sv1")),
        Stop("t1", Reason.ON_DEMAND_PREEMPTION, True, "checkpoint acknowledged"),
        Requeue("t1", Reason.ON_DEMAND_PREEMPTION, 2, "back in its queue"),
        Bind("sv1", "train", (A(1, 6, 7),), Reason.INCIDENT, FREED),
    ]


def test_lent_capacity_is_reclaimed_before_anything_is_preempted() -> None:
    s = make(cluster(lend=2))
    got = s.step(
        sub(
            job("t1").gpus(4).checkpointable().build(),
            job("b").gpus(2).checkpointable().build(),
        ),
        0,
    )
    assert got == [
        Bind("t1", "train", (A(1, 4, 5, 6, 7),)),
        Bind("b", "serve", (A(0, 0, 1),), Reason.LENT, "borrowing idle GPUs of serve", "serve"),
    ]
    got = flat(
        s,
        [
            (1000, sub(serving("sv1", gpus=4))),
            (1010, [CheckpointAck("b")]),
            (1020, [JobStopped("b")]),
        ],
    )
    assert got == [
        Notice("b", Reason.LENT_RECLAIM, 1060.0, "partition serve reclaims its lent GPUs for sv1"),
        Stop("b", Reason.LENT_RECLAIM, True, "checkpoint acknowledged"),
        Requeue("b", Reason.LENT_RECLAIM, 2, "back in its queue"),
        Bind("sv1", "serve", (A(0, 0, 1, 2, 3),)),
    ]
    assert s.counters.preemptions[Reason.INCIDENT_PREEMPTION] == 0


def test_requeued_victim_runs_again_when_gpus_free() -> None:
    s = make(cluster())
    busy(s, ("t1", 2, 0, True), ("t2", 2, 1, True))
    got = flat(
        s,
        [
            (1000, sub(serving("sv1"))),
            (1010, [CheckpointAck("t1")]),
            (1020, [JobStopped("t1")]),
            (2000, [JobFinished("t2")]),
        ],
    )
    assert got[-1] == Bind("t1", "train", (A(1, 4, 5),))
    assert s.job("t1").attempt == 2


def test_a_restored_notice_is_kept_not_given_again() -> None:
    """A front end restarted between a notice and its stop: the fresh core takes the notice
    back as it was (same deadline), gives no second one, names it to the waiting serving job,
    and stops the victim on its ack -- one preemption, counted once."""
    s = make(cluster(budget=2))
    busy(s, ("t1", 2, 0, True), ("t2", 2, 1, True))
    assert s.step(sub(serving("sv1")), 1000) == [
        Notice("t1", Reason.INCIDENT_PREEMPTION, 1120.0, WHY.format("sv1"))
    ]
    fresh = make(cluster(budget=2))
    restored = [
        JobRestored(
            job=s.job(j).job,
            pool="train",
            assignments=s.ledger.allocs[j].assignments,
            started_at=0.0,
            notice=(Reason.INCIDENT_PREEMPTION, 1120.0) if j == "t1" else None,
        )
        for j in ("t1", "t2")
    ]
    restored.append(JobRestored(s.job("sv0").job, "serve", s.ledger.allocs["sv0"].assignments))
    windows = PreemptionsRestored(tuple(s.query.preemption_windows().items()))
    assert fresh.step([*restored, windows, *sub(serving("sv1"))], 1010) == []
    assert fresh.waiting_on("sv1") == {"t1": 1120.0}
    assert fresh.next_wakeup() == 1120.0
    got = flat(fresh, [(1020, [CheckpointAck("t1")]), (1030, [JobStopped("t1")])])
    assert got == [
        Stop("t1", Reason.INCIDENT_PREEMPTION, True, "checkpoint acknowledged"),
        Requeue("t1", Reason.INCIDENT_PREEMPTION, 2, "back in its queue"),
        Bind("sv1", "train", (A(1, 6, 7),), Reason.INCIDENT, FREED),
    ]
    assert fresh.query.preemption_windows() == {"serve": (1000.0,)}
