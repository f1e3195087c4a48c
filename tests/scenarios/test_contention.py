"""Serving protection and reclaim under contention (issue 13, items 1 and 2): exact decisions
through ``Scheduler.step``.

1. protection fires while a gang holds the reservation of a full partition, and a second
   replica arriving while the first waits gets its own victims at once (not one grace period
   later);
2. reclaiming lent capacity takes what the waiting serving demand needs and no more, and each
   replica binds as soon as its own victim has stopped.
"""

from __future__ import annotations

import pytest
from scenario_harness import (
    A,
    CheckpointAck,
    JobCancelled,
    JobFinished,
    JobStopped,
    NodeDown,
    NodeUp,
    Step,
    Tick,
    make,
    run,
    sub,
)

from gpufence.model.decisions import Bind, Decision, Notice, PendingReason, Reason, Requeue, Stop
from gpufence.model.events import Event
from gpufence.model.job import WorkloadClass as W
from gpufence.sched.jobs import JobState
from gpufence.testing.builders import (
    ClusterBuilder,
    LendingRule,
    PreemptionMode,
    PreemptionPolicy,
    job,
)

SERVING = frozenset({W.SERVING})
TRAINING = frozenset({W.TRAINING})


def _serving(jid: str, gpus: int = 2, priority: int = 0):  # type: ignore[no-untyped-def]
    return job(jid).gpus(gpus).cls("serving").priority(priority).build()


def test_on_demand_preempts_while_a_gang_holds_the_reservation() -> None:
    """One shared partition, full, with a gang reserved for when running jobs end: a serving
    job arriving then preempts on demand (before: nothing, as long as the gang waited)."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.ON_DEMAND, from_partitions=("shared",), min_runtime_s=0.0
    )
    s = make(
        ClusterBuilder().nodes("n", 2, gpus=4).partition("shared", ["n"], preemption=pol).build()
    )
    fill = [job("t1").gpus(4).build(), job("t2").gpus(2).build(), job("t3").gpus(2).build()]
    s.step(sub(*fill, job("g").gang(2, gpus=4).build()), 0.0)
    assert s.query.reservation("shared") is not None
    got = run(
        s,
        [
            (10.0, sub(_serving("sv", priority=10))),
            (20.0, [CheckpointAck("t2")]),
            (21.0, [JobStopped("t2")]),
        ],
    )
    why = "serving job sv needs GPUs its fence shared cannot hold"
    assert got == [
        [Notice("t2", Reason.ON_DEMAND_PREEMPTION, 130.0, why)],  # fewest GPU-seconds lost
        [Stop("t2", Reason.ON_DEMAND_PREEMPTION, True, "checkpoint acknowledged")],
        [
            Requeue("t2", Reason.ON_DEMAND_PREEMPTION, 2, "back in its queue"),
            Bind("sv", "shared", (A(1, 4, 5),), Reason.FITS),
        ],
    ]


def _incident_cluster(lend: int = 0):  # type: ignore[no-untyped-def]
    """serve: node s-0 (GPUs 0-3, full with sv0); train: nodes t-0, t-1 (GPUs 4-11)."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.INCIDENT_ONLY,
        from_partitions=("train",),
        budget=8,
        window_s=3600.0,
        min_runtime_s=600.0,
        grace_s=120.0,
    )
    lending = (LendingRule(to=("train",), cap_gpus=lend, reclaim_deadline_s=120.0),) if lend else ()
    return (
        ClusterBuilder()
        .nodes("s", 1, gpus=4)
        .nodes("t", 2, gpus=4)
        .partition("serve", ["s"], admits=SERVING, preemption=pol, lending=lending)
        .partition("train", ["t"], admits=TRAINING)
        .build()
    )


def test_a_later_replica_gets_its_own_victim_at_once() -> None:
    """r2 arrives while r1 waits for t0: r2 must not count on t0's GPUs (r1 will take them)
    but notice t1 at once, so both replicas run one grace period after they arrived."""
    s = make(_incident_cluster())
    train = [job(f"t{i}").gpus(2).checkpointable().build() for i in range(4)]
    s.step(sub(job("sv0").gpus(4).cls("serving").build(), *train), 0.0)
    why = "serving job {} needs GPUs its fence serve cannot hold"
    got = run(
        s,
        [
            (1000.0, sub(_serving("r1"))),
            (1010.0, sub(_serving("r2"))),
            (1130.0, [Tick()]),  # both grace periods over: t0 and t1 stop
            (1131.0, [JobStopped("t0"), JobStopped("t1")]),
        ],
    )
    expired = "grace period expired without checkpoint ack"
    assert got == [
        [Notice("t0", Reason.INCIDENT_PREEMPTION, 1120.0, why.format("r1"))],
        [Notice("t1", Reason.INCIDENT_PREEMPTION, 1130.0, why.format("r2"))],
        [
            Stop("t0", Reason.INCIDENT_PREEMPTION, True, expired),
            Stop("t1", Reason.INCIDENT_PREEMPTION, True, expired),
        ],
        [
            Requeue("t0", Reason.INCIDENT_PREEMPTION, 2, "back in its queue"),
            Requeue("t1", Reason.INCIDENT_PREEMPTION, 2, "back in its queue"),
            Bind("r1", "train", (A(1, 4, 5),), Reason.INCIDENT, FREED),
            Bind("r2", "train", (A(1, 6, 7),), Reason.INCIDENT, FREED),
        ],
    ]


FREED = "on GPUs of train freed by incident preemption"


def test_reclaim_takes_only_what_serving_needs_and_each_replica_binds_on_its_own() -> None:
    """Two replicas of 2 GPUs, arriving one cycle apart, in a fence whose 4 GPUs are lent to
    ck1 and ck2: each reclaims one borrower; r1 binds when ck1 has stopped (its GPUs are not
    held for r2), r2 when ck2 has; nothing else is reclaimed."""
    s = make(_incident_cluster(lend=4))
    own = [job("own0").gpus(4).build(), job("own1").gpus(4).build()]
    ck = [job("ck1").gpus(2).checkpointable().build(), job("ck2").gpus(2).checkpointable().build()]
    s.step(sub(*own, *ck), 0.0)
    why = "partition serve reclaims its lent GPUs for {}"
    got = run(
        s,
        [
            (100.0, sub(_serving("r1"))),
            (110.0, sub(_serving("r2"))),
            (130.0, [CheckpointAck("ck1")]),
            (131.0, [JobStopped("ck1")]),
            (230.0, [Tick()]),
            (231.0, [JobStopped("ck2")]),
        ],
    )
    assert got == [
        [Notice("ck1", Reason.LENT_RECLAIM, 220.0, why.format("r1"))],
        [Notice("ck2", Reason.LENT_RECLAIM, 230.0, why.format("r2"))],
        [Stop("ck1", Reason.LENT_RECLAIM, True, "checkpoint acknowledged")],
        [
            Requeue("ck1", Reason.LENT_RECLAIM, 2, "back in its queue"),
            Bind("r1", "serve", (A(0, 0, 1),)),
        ],
        [Stop("ck2", Reason.LENT_RECLAIM, True, "grace period expired without checkpoint ack")],
        [
            Requeue("ck2", Reason.LENT_RECLAIM, 2, "back in its queue"),
            Bind("r2", "serve", (A(0, 2, 3),)),
        ],
    ]
    assert s.counters.reclaims[Reason.LENT_RECLAIM] == 2


def test_a_job_waiting_for_a_victim_names_it_and_its_deadline() -> None:
    s = make(_incident_cluster(lend=4))
    own = [job("own0").gpus(4).build(), job("own1").gpus(4).build()]
    s.step(sub(*own, job("ck1").gpus(4).checkpointable().build()), 0.0)
    s.step(sub(_serving("r1")), 100.0)
    msg = "waiting for ck1 to stop (notice deadline t=220)"
    assert s.why_pending("r1") == PendingReason(Reason.WAITING_PREEMPTION, msg)


def test_a_gang_reservation_holds_no_gpus_against_serving_in_a_protecting_fence() -> None:
    """Equal priorities: the 2 free GPUs are held for the gang, but a serving job of the same
    fence (which protects serving) takes them, and the gang is planned again."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.ON_DEMAND, from_partitions=("shared",), min_runtime_s=0.0
    )
    s = make(
        ClusterBuilder().nodes("n", 2, gpus=4).partition("shared", ["n"], preemption=pol).build()
    )
    s.step(sub(job("t1").gpus(4).build(), job("t2").gpus(2).build()), 0.0)
    s.step(sub(job("g").gang(2, gpus=4).build()), 1.0)
    assert s.step(sub(_serving("sv")), 2.0) == [Bind("sv", "shared", (A(1, 6, 7),))]


def _lend_cluster():  # type: ignore[no-untyped-def]
    """serve: nodes s-0 (GPUs 0-1), s-1 (2-3), all lendable to train (t-0, GPUs 4-5)."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.INCIDENT_ONLY, from_partitions=("train",), budget=4, grace_s=30.0
    )
    lend = LendingRule(to=("train",), cap_gpus=4, reclaim_deadline_s=120.0)
    return (
        ClusterBuilder()
        .nodes("s", 2, gpus=2)
        .nodes("t", 1, gpus=2)
        .partition("serve", ["s"], admits=SERVING, preemption=pol, lending=(lend,))
        .partition("train", ["t"], admits=TRAINING)
        .build()
    )


LENT = "borrowing idle GPUs of serve"
RECLAIM = "partition serve reclaims its lent GPUs for {}"
ACKED = "checkpoint acknowledged"
_W = job("w").gang(2, gpus=2).cls("serving").priority(2).build()
_B = job("b").gang(3, gpus=1).checkpointable().build()
_ONE = [job(f"b{i}").gpus(1).checkpointable().build() for i in range(4)]

READY_CASES = [
    pytest.param(
        [
            (0.0, sub(job("o1").gpus(1).build(), job("o2").gpus(1).build(), _B)),
            (10.0, sub(_W)),
            (20.0, [JobFinished("o2")]),
            (30.0, sub(_serving("v", gpus=1, priority=1))),
            (31.0, [Tick()]),
            (40.0, [CheckpointAck("b")]),
            (41.0, [JobStopped("b")]),
        ],
        [
            [
                Bind("o1", "train", (A(2, 4),)),
                Bind("o2", "train", (A(2, 5),)),
                Bind("b", "serve", (A(0, 0), A(0, 1), A(1, 2)), Reason.LENT, LENT, "serve"),
            ],
            [Notice("b", Reason.LENT_RECLAIM, 130.0, RECLAIM.format("w"))],
            [],
            [],  # GPU 3 is held for w: v is nominated on the free GPU 5 of train
            [Bind("v", "train", (A(2, 5),), Reason.INCIDENT, FREED)],  # before: GPU 3 of serve
            [Stop("b", Reason.LENT_RECLAIM, True, ACKED)],
            [
                Requeue("b", Reason.LENT_RECLAIM, 2, "back in its queue"),
                Bind("w", "serve", (A(0, 0, 1), A(1, 2, 3))),
            ],
        ],
        id="a job nominated on free donor capacity leaves the GPU held for a waiting gang",
    ),
    pytest.param(
        [
            (0.0, sub(job("o").gpus(2).build(), *_ONE)),
            (10.0, sub(_serving("r1"), _serving("r2"))),
            (12.0, [Tick()]),  # r1 and r2 are both planned on GPUs 0-1 (r2 waits for b0-b3)
            (20.0, [CheckpointAck("b0"), CheckpointAck("b1")]),
            (21.0, [JobStopped("b0"), JobStopped("b1")]),
        ],
        [
            [
                Bind("o", "train", (A(2, 4, 5),)),
                *(
                    Bind(f"b{i}", "serve", (A(i // 2, i),), Reason.LENT, LENT, "serve")
                    for i in range(4)
                ),
            ],
            [
                Notice(f"b{i}", Reason.LENT_RECLAIM, 130.0, RECLAIM.format(f"r{1 + i // 2}"))
                for i in range(4)
            ],
            [],
            [
                Stop("b0", Reason.LENT_RECLAIM, True, ACKED),
                Stop("b1", Reason.LENT_RECLAIM, True, ACKED),
            ],
            [
                Requeue("b0", Reason.LENT_RECLAIM, 2, "back in its queue"),
                Requeue("b1", Reason.LENT_RECLAIM, 2, "back in its queue"),
                Bind("r1", "serve", (A(0, 0, 1),)),
            ],
        ],
        id="a ready job takes the GPUs planned for it, though planned for a waiting one too",
    ),
]


@pytest.mark.parametrize(("steps", "expected"), READY_CASES)
def test_jobs_whose_victims_stopped_bind_without_taking_what_a_waiting_job_was_given(
    steps: list[Step], expected: list[list[Decision]]
) -> None:
    """Nominated jobs whose victims have stopped (or that need none) bind first, while the free
    GPUs planned for the jobs still waiting are held, except those planned for a ready job
    too (jobs nominated in one batch wait for all its victims, so their plans may overlap).
    Before, nothing was held while they bound: v took the GPU held for w in the walk, and w
    waited for b, whose GPUs no longer made room for it (found by
    test_guarantees_where_lending_meets_protection)."""
    s = make(_lend_cluster())
    assert run(s, steps) == expected


def _hold_cluster():  # type: ignore[no-untyped-def]
    """serve: nodes s-0, s-1 (GPUs 0-3), preempting train at once (grace 30 s); train: nodes
    t-0, t-1 (GPUs 4-7)."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.INCIDENT_ONLY,
        from_partitions=("train",),
        budget=4,
        min_runtime_s=0.0,
        grace_s=30.0,
    )
    return (
        ClusterBuilder()
        .nodes("s", 2, gpus=2)
        .nodes("t", 2, gpus=2)
        .partition("serve", ["s"], admits=SERVING, preemption=pol)
        .partition("train", ["t"], admits=TRAINING)
        .build()
    )


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(JobCancelled("w"), id="the waiting job is cancelled"),
        pytest.param(NodeDown("t-1"), id="a node of its plan fails: it fits there no more"),
    ],
)
def test_gpus_no_longer_held_for_a_waiting_job_go_to_the_queue_at_once(event: Event) -> None:
    """Gang w (2x2) waits for v's incident preemption with GPUs 5-7 of train held for it, so
    b (1 GPU of train) waits. When the holds go (w cancelled, or its plan lost with a node),
    b binds in that cycle: before, nothing was released in train, so the partition was not
    walked again and b waited, with its GPUs free, until something else changed (found by
    test_guarantees_where_lending_meets_protection: work conservation)."""
    s = make(_hold_cluster())
    fill = [
        _serving("s0", gpus=1),
        _serving("s1", gpus=1),
        job("v").gpus(1).checkpointable().build(),
    ]
    got = run(
        s,
        [
            (0.0, sub(*fill)),
            (10.0, sub(job("w").gang(2, gpus=2).cls("serving").build())),
            (11.0, sub(job("b").gpus(1).build())),
            (12.0, [event]),
        ],
    )
    why = "serving job w needs GPUs its fence serve cannot hold"
    assert got == [
        [
            Bind("s0", "serve", (A(0, 0),)),
            Bind("s1", "serve", (A(0, 1),)),
            Bind("v", "train", (A(2, 4),)),
        ],
        [Notice("v", Reason.INCIDENT_PREEMPTION, 40.0, why)],
        [],  # b: "needs 1 free GPU, partition train has 0 free (3 held for w)"
        [Bind("b", "train", (A(2, 5),))],
    ]


def test_a_job_whose_victims_no_longer_make_room_is_protected_again_at_once() -> None:
    """Gang w waits for v's incident preemption (plan: both train nodes). t-1 fails: no plan
    holds anything, so x binds on t-0's other GPU; t-1 comes back, and v alone no longer makes
    room for w. w gives up waiting for v and protection notices x at once: w runs one grace
    period later. Before, w waited for v; v, requeued, bound again on the GPU it freed, and
    both were noticed only then -- three preemptions, and w ran 28 s later (found by
    test_guarantees_where_lending_meets_protection: protection liveness)."""
    s = make(_hold_cluster())
    v, x = (job(j).gpus(1).checkpointable().build() for j in ("v", "x"))
    got = run(
        s,
        [
            (0.0, sub(_serving("s0", gpus=1), _serving("s1", gpus=1), v)),
            (10.0, sub(job("w").gang(2, gpus=2).cls("serving").build())),
            (11.0, [NodeDown("t-1")]),
            (12.0, sub(x)),
            (13.0, [NodeUp("t-1")]),
            (14.0, [Tick()]),
            (40.0, [Tick()]),
            (41.0, [JobStopped("v")]),
            (43.0, [Tick()]),
            (44.0, [JobStopped("x")]),
        ],
    )
    why = "serving job w needs GPUs its fence serve cannot hold"
    expired = "grace period expired without checkpoint ack"
    assert got == [
        [
            Bind("s0", "serve", (A(0, 0),)),
            Bind("s1", "serve", (A(0, 1),)),
            Bind("v", "train", (A(2, 4),)),
        ],
        [Notice("v", Reason.INCIDENT_PREEMPTION, 40.0, why)],
        [],
        [Bind("x", "train", (A(2, 5),))],
        [Notice("x", Reason.INCIDENT_PREEMPTION, 43.0, why)],
        [],
        [Stop("v", Reason.INCIDENT_PREEMPTION, True, expired)],
        [Requeue("v", Reason.INCIDENT_PREEMPTION, 2, "back in its queue")],
        [Stop("x", Reason.INCIDENT_PREEMPTION, True, expired)],
        [
            Requeue("x", Reason.INCIDENT_PREEMPTION, 2, "back in its queue"),
            Bind("w", "train", (A(2, 4, 5), A(3, 6, 7)), Reason.INCIDENT, FREED),
        ],
    ]


def test_a_node_failure_lets_protection_give_the_capacity_coming_back_to_the_next_job() -> None:
    """Serving a (5x1) waits for b1 (3 GPUs, priority 3) to stop; serving b (3x1) cannot be
    helped (a goes first). b1 is stopping when node n-0 fails: a no longer fits on what b1
    frees, so protection looks again and gives it to b, which binds when b1 has stopped.
    Before, a node failure did not change the picture protection looks at: b was not
    nominated, b1 (requeued, priority 3) bound again on the GPUs it freed and was noticed a
    second time, for b (found by test_guarantees_in_one_shared_partition: protection
    liveness)."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.ON_DEMAND, from_partitions=("p",), grace_s=30.0, min_runtime_s=0.0
    )
    s = make(ClusterBuilder().nodes("n", 3, gpus=2).partition("p", ["n"], preemption=pol).build())
    b1 = job("b1").gang(3, gpus=1).priority(3).build()
    got = run(
        s,
        [
            (0.0, sub(b1, job("o").gpus(1).build())),
            (1.0, sub(job("a").gang(5, gpus=1).cls("serving").build())),
            (2.0, sub(job("b").gang(3, gpus=1).cls("serving").build())),
            (3.0, [CheckpointAck("b1")]),
            (4.0, [NodeDown("n-0")]),
            (5.0, [JobStopped("b1")]),
        ],
    )
    why = "serving job a needs GPUs its fence p cannot hold"
    assert got == [
        [Bind("b1", "p", (A(0, 0), A(0, 1), A(1, 2))), Bind("o", "p", (A(1, 3),))],
        [Notice("b1", Reason.ON_DEMAND_PREEMPTION, 31.0, why)],
        [],
        [Stop("b1", Reason.ON_DEMAND_PREEMPTION, True, ACKED)],
        [],
        [
            Requeue("b1", Reason.ON_DEMAND_PREEMPTION, 2, "back in its queue"),
            Bind("b", "p", (A(2, 4), A(2, 5), A(1, 2))),
        ],
    ]
    assert s.job("b").state is JobState.RUNNING and s.job("b1").state is JobState.PENDING


def test_jobs_nominated_in_one_batch_are_planned_on_different_gpus() -> None:
    """r1 (3x1) and r2 (2x2) arrive together: r1 waits for b, r2 for b, f and t (a batch's
    jobs wait for all of its victims). r2's plan leaves b's GPUs to r1, so when t exits
    during its notice (and is requeued), the GPUs it freed are held for r2, and both bind
    once b has stopped. Before, r2 was planned on b's GPUs too: nothing held what t freed, t
    bound again on it, and was noticed a second time for r2 (found by
    test_guarantees_in_one_shared_partition, seed 503: protection liveness)."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.ON_DEMAND, from_partitions=("p",), grace_s=120.0, min_runtime_s=0.0
    )
    s = make(ClusterBuilder().nodes("n", 1, gpus=8).partition("p", ["n"], preemption=pol).build())
    fill = [
        job("b").gang(3, gpus=1).priority(3).build(),
        job("t").gpus(3).priority(3).checkpointable().build(),
        job("f").gpus(2).build(),
    ]
    r1 = job("r1").gang(3, gpus=1).cls("serving").priority(2).build()
    r2 = job("r2").gang(2, gpus=2).cls("serving").priority(2).build()
    got = run(
        s,
        [
            (0.0, sub(*fill)),
            (1.0, sub(r1, r2)),
            (2.0, [JobFinished("f")]),
            (130.0, [JobFinished("t", False)]),
            (140.0, [JobStopped("b")]),
        ],
    )
    why = "serving job {} needs GPUs its fence p cannot hold"
    assert got == [
        [
            Bind("b", "p", (A(0, 0), A(0, 1), A(0, 2))),
            Bind("t", "p", (A(0, 3, 4, 5),)),
            Bind("f", "p", (A(0, 6, 7),)),
        ],
        [
            Notice("b", Reason.ON_DEMAND_PREEMPTION, 121.0, why.format("r1")),
            Notice("f", Reason.ON_DEMAND_PREEMPTION, 121.0, why.format("r2")),
            Notice("t", Reason.ON_DEMAND_PREEMPTION, 121.0, why.format("r2")),
        ],
        [],
        [
            Stop("t", Reason.ON_DEMAND_PREEMPTION, True, "exited during its notice"),
            Requeue("t", Reason.ON_DEMAND_PREEMPTION, 2, "back in its queue"),
            Stop(
                "b",
                Reason.ON_DEMAND_PREEMPTION,
                True,
                "grace period expired without checkpoint ack",
            ),
        ],
        [
            Requeue("b", Reason.ON_DEMAND_PREEMPTION, 2, "back in its queue"),
            Bind("r1", "p", (A(0, 0), A(0, 1), A(0, 2))),
            Bind("r2", "p", (A(0, 3, 4), A(0, 5, 6))),
        ],
    ]
    assert s.job("t").state is JobState.PENDING
