"""Drained nodes and maintenance windows are the core's events: a drained node takes no new
work (what runs finishes, or with a deadline is noticed and stopped by it); a job whose time
limit would overlap a maintenance window does not start on the window's nodes (a job without
one is unbounded), the nodes take no work during the window, and pending reasons name the drain
or the window."""

from __future__ import annotations

from scenario_harness import A, CheckpointAck, JobFinished, JobStopped, Tick, make, run, sub

from gpufence.model.decisions import (
    Bind,
    Notice,
    NoticeWithdrawn,
    PendingReason,
    Reason,
    Requeue,
    Stop,
)
from gpufence.model.events import (
    MaintenanceCancelled,
    MaintenanceScheduled,
    NodeDown,
    NodeDrained,
    NodeUndrained,
    NodeUp,
)
from gpufence.sched.scheduler import Scheduler
from gpufence.testing.builders import ClusterBuilder, job


def two_nodes() -> Scheduler:
    """Partition p: nodes n-0 (GPUs 0-3) and n-1 (GPUs 4-7)."""
    return make(ClusterBuilder().nodes("n", 2, gpus=4).partition("p", ["n"]).build())


def test_drain_keeps_new_work_off_and_lets_running_work_finish() -> None:
    s = two_nodes()
    got = run(
        s,
        [
            (0, sub(job("a").gpus(4).build())),
            (1, [NodeDrained("n-0", "swap a DIMM")]),
            (2, sub(job("c").gpus(1).build())),
            (3, [JobFinished("a", True)]),
            (4, sub(job("d").gpus(4).build())),
            (5, [NodeUndrained("n-0")]),
        ],
    )
    assert got == [
        [Bind("a", "p", (A(0, 0, 1, 2, 3),))],
        [],  # a keeps running: a drain without a deadline stops nothing
        [Bind("c", "p", (A(1, 4),))],
        [],
        [],  # n-0 is free but drained; n-1 has 3 free
        [Bind("d", "p", (A(0, 0, 1, 2, 3),))],
    ]


def test_pending_reason_names_the_drain() -> None:
    s = two_nodes()
    run(
        s,
        [
            (0, sub(job("a").gpus(4).build())),
            (1, [NodeDrained("n-1", "firmware")]),
            (2, sub(job("b").gpus(1).build())),
        ],
    )
    assert s.why_pending("b") == PendingReason(Reason.NO_FIT, "node n-1 drained: firmware")


def test_drain_with_deadline_notices_then_stops_and_requeues() -> None:
    s = two_nodes()
    b = job("b").gpus(4).checkpointable().build()
    got = run(
        s,
        [
            (0, sub(job("a").gpus(4).build(), b)),
            (1, [NodeDrained("n-1", "reboot", deadline=10.0)]),
            (5, [CheckpointAck("b")]),
            (6, [JobStopped("b")]),
            (7, [JobFinished("a", True)]),
        ],
    )
    msg = "node n-1 drained: reboot; checkpoint and stop by t=10"
    assert got == [
        [Bind("a", "p", (A(0, 0, 1, 2, 3),)), Bind("b", "p", (A(1, 4, 5, 6, 7),))],
        [Notice("b", Reason.DRAIN, 10.0, msg)],
        [Stop("b", Reason.DRAIN, True, "checkpoint acknowledged")],
        [Requeue("b", Reason.DRAIN, 2, "back in its queue")],
        [Bind("b", "p", (A(0, 0, 1, 2, 3),))],  # attempt 2 runs elsewhere, not on n-1
    ]


def test_drain_deadline_passes_without_an_ack() -> None:
    s = two_nodes()
    got = run(
        s,
        [
            (0, sub(job("a").gpus(4).build())),
            (1, [NodeDrained("n-0", "reboot", deadline=10.0)]),
            (10, [Tick()]),
        ],
    )
    assert got[2] == [Stop("a", Reason.DRAIN, True, "grace period expired without checkpoint ack")]
    assert s.next_wakeup() is None


def test_undrain_before_the_deadline_withdraws_the_notice() -> None:
    s = two_nodes()
    got = run(
        s,
        [
            (0, sub(job("a").gpus(4).build())),
            (1, [NodeDrained("n-0", "reboot", deadline=10.0)]),
            (2, [NodeUndrained("n-0")]),
            (10, [Tick()]),
        ],
    )
    assert got[2:] == [[NoticeWithdrawn("a", Reason.DRAIN, "node n-0 undrained")], []]


def test_a_drained_node_that_comes_back_from_a_failure_stays_drained() -> None:
    s = two_nodes()
    got = run(
        s,
        [
            (0, [NodeDrained("n-0", "disk")]),
            (1, [NodeDown("n-0"), NodeUp("n-0")]),
            (2, sub(job("a").gpus(4).build(), job("b").gpus(4).build())),
            (3, [NodeUndrained("n-0")]),
        ],
    )
    assert got == [
        [],
        [],
        [Bind("a", "p", (A(1, 4, 5, 6, 7),))],
        [Bind("b", "p", (A(0, 0, 1, 2, 3),))],
    ]


WINDOW = MaintenanceScheduled("m1", ("n-0",), 100.0, 200.0, "firmware")
M1 = "maintenance m1 on n-0 from t=100 for 100 s: firmware"


def test_jobs_that_would_overlap_the_window_stay_off_its_nodes() -> None:
    """y (limit 150) would run into the window on n-0, so it takes n-1 although n-0 comes first;
    x (limit 50) ends before the window and takes n-0; z (no limit: unbounded) waits."""
    s = two_nodes()
    got = run(
        s,
        [
            (0, [WINDOW]),
            (
                1,
                sub(
                    job("y").gpus(4).limit(150).build(),
                    job("x").gpus(4).limit(50).build(),
                    job("z").gpus(4).build(),
                ),
            ),
        ],
    )
    assert got == [
        [],
        [Bind("y", "p", (A(1, 4, 5, 6, 7),)), Bind("x", "p", (A(0, 0, 1, 2, 3),))],
    ]
    assert s.why_pending("z") == PendingReason(
        Reason.NO_FIT, "needs 4 free GPUs, partition p has 0 free; GPUs reserved from t=151"
    )
    got = run(s, [(60, [JobFinished("x", True)])])
    assert got == [[]]
    assert s.why_pending("z") == PendingReason(Reason.NO_FIT, f"{M1}; GPUs reserved from t=151")


def test_backfill_before_the_window_and_nothing_during_it() -> None:
    """With z waiting for n-1 (reserved from t=151), a 30 s job starts on n-0 before the window
    and a 50 s one (60 + 50 > 100) waits; during the window n-0 takes nothing; it comes back at
    its end."""
    s = two_nodes()
    run(
        s,
        [
            (0, [WINDOW]),
            (1, sub(job("y").gpus(4).limit(150).build(), job("z").gpus(4).build())),
        ],
    )
    got = run(
        s,
        [
            (60, sub(job("s").gpus(2).limit(30).build(), job("w").gpus(2).limit(50).build())),
            (90, [JobFinished("s", True)]),
            (100, [Tick()]),
            (120, sub(job("u").gpus(1).limit(5).build())),
            (151, [JobFinished("y", True)]),
            (200, [Tick()]),
        ],
    )
    assert got == [
        [Bind("s", "p", (A(0, 0, 1),))],
        [],
        [],
        [],
        [Bind("z", "p", (A(1, 4, 5, 6, 7),))],
        [Bind("w", "p", (A(0, 0, 1),)), Bind("u", "p", (A(0, 2),))],
    ]
    assert s.next_wakeup() == 205.0  # u's time limit: the window is over and forgotten


def test_waiting_reason_names_the_window_and_cancelling_it_lets_the_job_start() -> None:
    s = two_nodes()
    got = run(
        s,
        [
            (0, [WINDOW]),
            (1, sub(job("a").gpus(4).build(), job("b").gpus(4).build())),
        ],
    )
    assert got == [[], [Bind("a", "p", (A(1, 4, 5, 6, 7),))]]
    assert s.why_pending("b") == PendingReason(
        Reason.NO_FIT, f"{M1}; GPUs reserved from when running jobs end"
    )
    assert s.next_wakeup() == 100.0
    assert run(s, [(2, [MaintenanceCancelled("m1")])]) == [[Bind("b", "p", (A(0, 0, 1, 2, 3),))]]


def test_a_gang_keeps_its_drain_notice_while_one_of_its_nodes_is_still_drained() -> None:
    s = two_nodes()
    got = run(
        s,
        [
            (0, sub(job("g").gang(2, gpus=4).build())),
            (1, [NodeDrained("n-0", "rack work", 50.0), NodeDrained("n-1", "rack work", 60.0)]),
            (2, [NodeUndrained("n-0")]),
            (3, [NodeUndrained("n-1")]),
        ],
    )
    msg = "node n-0 drained: rack work; checkpoint and stop by t=50"
    assert got == [
        [Bind("g", "p", (A(0, 0, 1, 2, 3), A(1, 4, 5, 6, 7)))],
        [Notice("g", Reason.DRAIN, 50.0, msg)],  # the earlier deadline stands
        [],  # n-1 is still drained with a deadline: the notice stays
        [NoticeWithdrawn("g", Reason.DRAIN, "node n-1 undrained")],
    ]


def test_during_the_window_the_reason_names_it() -> None:
    s = two_nodes()
    run(s, [(0, [WINDOW]), (1, sub(job("a").gpus(4).build()))])
    run(s, [(100, sub(job("b").gpus(4).build()))])
    ends = "GPUs reserved from when running jobs end"
    assert s.why_pending("b") == PendingReason(Reason.NO_FIT, f"{M1}; {ends}")
    run(s, [(101, sub(job("c").gpus(1).build()))])
    assert s.why_pending("c") == PendingReason(
        Reason.NO_FIT,
        f"partition p has 0 of 8 GPUs free ({M1}); gang b holds the reservation (when running "
        "jobs end)",
    )


def test_a_drained_node_in_a_window_is_named_once_with_its_window() -> None:
    s = two_nodes()
    run(
        s,
        [
            (0, [WINDOW, NodeDrained("n-0", "swap a PSU"), NodeDrained("n-1", "disk")]),
            (1, sub(job("a").gpus(1).build())),
        ],
    )
    assert s.why_pending("a") == PendingReason(
        Reason.NO_FIT, f"node n-0 drained: swap a PSU; node n-1 drained: disk; {M1}"
    )
