"""MIG defragmentation by stopping (issue 33 item 6, sched/migdefrag_stop.py): the GPU drained
for a 7g job is cleared by noticing the checkpointable 1g jobs in its way, under the partition's
``mig.defrag_budget``; stopped jobs requeue and resume; once the budget is spent the drain goes
on by attrition and the pending reason says so.

Each scenario is a table of steps: (time, events, the exact decisions of that step). The
cluster: one H100 node, 3 GPUs cut 7 x 1g.10gb, dynamic MIG, 30 s re-cuts, min_runtime_s 600
(the partition's preemption default). At t=0 21 1g jobs fill it; at t=10 all but j0, j6 (GPU 0),
j7 (GPU 1) and j14 (GPU 2) end, so a 7g job finds no GPU although 20 slices are free."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from scenario_harness import A, CheckpointAck, JobFinished, JobStopped, MigReconfigured, make, sub

from gpufence.model.decisions import (
    Bind,
    Decision,
    MigReconfigure,
    Notice,
    PendingReason,
    Reason,
    Requeue,
    Stop,
)
from gpufence.model.events import DefragsRestored, Event, Tick
from gpufence.testing.builders import ClusterBuilder, MigConfig, SharingMode, job

ONE_G = "1g.10gb"
SEVEN_G = "7g.80gb"
KEEP = (0, 6, 7, 14)  # the 1g jobs still running after t=10


def _scheduler(budget: int, checkpointable: bool = True):  # type: ignore[no-untyped-def]
    mig = MigConfig(
        layout=(ONE_G,) * 7, dynamic=True, reconfigure_delay_s=30.0, defrag_budget=budget
    )
    c = (
        ClusterBuilder()
        .nodes("n", 1, gpus=3)
        .partition("m", ["n"], sharing=SharingMode.MIG, mig=mig)
        .build()
    )
    s = make(c)
    small = [job(f"j{i}").mig(ONE_G).checkpointable(checkpointable).build() for i in range(21)]
    assert len(s.step(sub(*small), 0)) == 21
    assert s.step([JobFinished(f"j{i}") for i in range(21) if i not in KEEP], 10) == []
    return s


def bind(jid: str, gpu: int, profile: str, start: int) -> Bind:
    return Bind(jid, "m", (A(0, gpu, mig_profile=profile, mig_start=start),))


def recut(gpu: int) -> MigReconfigure:
    msg = f"re-partition idle GPU {gpu} for pending {SEVEN_G} demand"
    return MigReconfigure(gpu, (f"{SEVEN_G}@0",), Reason.MIG_LAYOUT, 30.0, msg)


def notice(jid: str, gpu: int, big: str, deadline: float) -> Notice:
    msg = f"GPU {gpu} is re-packed for {SEVEN_G} job {big}"
    return Notice(jid, Reason.MIG_DEFRAG, deadline, msg)


def stop(jid: str) -> Stop:
    return Stop(jid, Reason.MIG_DEFRAG, True, "checkpoint acknowledged")


Table = Sequence[tuple[float, Sequence[Event], Sequence[Decision]]]

# budget 2: the drained GPU's j7 is too young at t=20, is noticed at t=600 when it may be
# stopped, checkpoints, stops and requeues (and resumes on GPU 0); GPU 1 is re-cut for big1
STOP_FOR_BIG: Table = [
    (20, sub(job("big1").mig(SEVEN_G).build()), []),
    (600, [Tick()], [notice("j7", 1, "big1", 720.0)]),
    (610, [CheckpointAck("j7")], [stop("j7")]),
    (
        620,
        [JobStopped("j7")],
        [
            Requeue("j7", Reason.MIG_DEFRAG, 2, "back in its queue"),
            recut(1),
            bind("j7", 0, ONE_G, 2),
        ],
    ),
    (650, [MigReconfigured(1)], [bind("big1", 1, SEVEN_G, 0)]),
]

# budget 1, spent on big1: big2 waits by attrition (no notice to j14) until j14 ends by itself
BUDGET_SPENT: Table = [
    *STOP_FOR_BIG,
    (700, sub(job("big2").mig(SEVEN_G).build()), []),
    (5000, [JobFinished("j14")], [recut(2)]),
    (5030, [MigReconfigured(2)], [bind("big2", 2, SEVEN_G, 0)]),
]

# budget 2 but the 1g jobs are not checkpointable: attrition, as before the defrag
NOT_CHECKPOINTABLE: Table = [
    (20, sub(job("big1").mig(SEVEN_G).build()), []),
    (600, [Tick()], []),
    (4000, [JobFinished("j7")], [recut(1)]),
    (4030, [MigReconfigured(1)], [bind("big1", 1, SEVEN_G, 0)]),
]


@pytest.mark.parametrize(
    ("budget", "checkpointable", "table"),
    [(2, True, STOP_FOR_BIG), (1, True, BUDGET_SPENT), (2, False, NOT_CHECKPOINTABLE)],
    ids=["stop-for-big", "budget-spent", "not-checkpointable"],
)
def test_defrag_decisions(budget: int, checkpointable: bool, table: Table) -> None:
    s = _scheduler(budget, checkpointable)
    for t, events, want in table:
        assert s.step(list(events), t) == list(want), f"at t={t:g}"


def test_the_reason_tells_the_defrag_in_each_phase() -> None:
    """Too young, stopping, then budget spent: the pending reason says which, with numbers."""
    s = _scheduler(1)
    s.step(sub(job("big1").mig(SEVEN_G).build()), 20)
    drained = f"GPU 1 is drained for {SEVEN_G} (it takes no new job): waiting for j7 to end"
    assert s.why_pending("big1") == PendingReason(
        Reason.MIN_RUNTIME,
        f"{drained} (MIG defrag may stop them from t=600: jobs run at least min_runtime_s 600 "
        "before they are stopped)",
    )
    assert s.next_wakeup() == 600.0
    s.step([Tick()], 600)
    assert s.why_pending("big1") == PendingReason(
        Reason.WAITING_PREEMPTION,
        f"GPU 1 is drained for {SEVEN_G}: MIG defrag stops j7 (checkpointable; 1 of 1 defrag "
        "stops in 86400 s)",
    )
    for t, events, _ in STOP_FOR_BIG[2:]:
        s.step(list(events), t)
    s.step(sub(job("big2").mig(SEVEN_G).build()), 700)
    assert s.why_pending("big2") == PendingReason(
        Reason.PREEMPTION_BUDGET,
        "MIG defrag budget spent (1 of 1 in 86400 s; stopping j14 on GPU 2 takes 1): GPU 1 is "
        f"drained for {SEVEN_G} (it takes no new job): waiting for big1 to end",
    )
    assert s.next_wakeup() == 600.0 + 86400.0  # a budget slot frees up
    assert s.state.book.counters.preemptions[Reason.MIG_DEFRAG] == 1


def test_a_restarted_core_given_the_saved_window_refuses_the_stop_it_already_made() -> None:
    """Budget 1: j7 was noticed for big1 at t=600. A restarted core handed the saved window
    (``DefragsRestored`` of ``query.defrag_windows()``) does not notice j7 again for the same
    drain: the budget stays spent until the stop leaves the window. Was: a restart forgot the
    stop and noticed j7 at once (a crash loop stopped jobs without limit)."""
    s = _scheduler(1)
    for t, events, want in STOP_FOR_BIG[:2]:
        assert s.step(list(events), t) == list(want), f"at t={t:g}"
    saved = s.query.defrag_windows()
    assert saved == {"m": (600.0,)}

    fresh = _scheduler(1)  # (the same jobs running: j0, j6, j7, j14)
    assert fresh.step([DefragsRestored(tuple(saved.items())), *sub(_big1())], 700) == []
    why = fresh.why_pending("big1")
    assert why is not None and why.reason is Reason.PREEMPTION_BUDGET, why
    assert fresh.query.defrag_windows() == saved
    assert fresh.next_wakeup() == 600.0 + 86400.0  # the slot frees up then, not before
    assert fresh.step([Tick()], 600.0 + 86400.0 - 1) == []
    assert fresh.step([Tick()], 600.0 + 86400.0) == [notice("j7", 1, "big1", 87120.0)]


def _big1():  # type: ignore[no-untyped-def]
    return job("big1").mig(SEVEN_G).build()


@pytest.mark.parametrize(
    ("saved", "first_notice_at"),
    [
        ({"m": (15.0,)}, 15.0 + 86400.0),  # spent: the next stop waits for the slot
        ({}, 600.0),  # nothing saved: the budget is whole
        ({"other": (15.0,)}, 600.0),  # another pool's window
        ({"m": (-86400.0,)}, 600.0),  # out of the window by then
        ({"m": (float("nan"), float("inf"), 5000.0)}, 600.0),  # not stops made by t=20
    ],
    ids=["spent", "nothing-saved", "other-pool", "expired", "impossible-times"],
)
def test_a_restored_defrag_window_counts_as_if_never_restarted(
    saved: dict[str, tuple[float, ...]], first_notice_at: float
) -> None:
    s = _scheduler(1)
    assert s.step([DefragsRestored(tuple(saved.items())), *sub(_big1())], 20) == []
    assert s.step([Tick()], 600) == (
        [] if first_notice_at > 600 else [notice("j7", 1, "big1", 720.0)]
    )
    if first_notice_at == 600:
        return
    why = s.why_pending("big1")
    assert why is not None and why.reason is Reason.PREEMPTION_BUDGET, why
    assert s.step([Tick()], first_notice_at - 1) == []
    assert s.step([Tick()], first_notice_at) == [notice("j7", 1, "big1", first_notice_at + 120.0)]


def test_no_budget_is_attrition_only() -> None:
    """defrag_budget 0 (the default) never notices anyone: the drain waits for j7 to end."""
    s = _scheduler(0)
    s.step(sub(job("big1").mig(SEVEN_G).build()), 20)
    assert s.step([Tick()], 600) == []
    assert s.why_pending("big1").reason is Reason.MIG_LAYOUT  # type: ignore[union-attr]


def _bind4(jid: str, gpu: int) -> Bind:
    return bind(jid, gpu, "4g.40gb", 0)


def _cut4(gpu: int) -> MigReconfigure:
    layout = ("4g.40gb@0", "1g.10gb@4", "1g.10gb@5", "1g.10gb@6")
    msg = f"re-partition idle GPU {gpu} for pending 4g.40gb demand"
    return MigReconfigure(gpu, layout, Reason.MIG_LAYOUT, 30.0, msg)


# two uncut GPUs, budget 2: checkpointable 4g jobs a and b on one GPU each; the 7g c stops a.
# a is requeued ahead of c (older), yet does not re-cut GPU 0 back for itself (it was stopped
# for c: c binds at 800), and a 4g is never stopped for a 4g (no Notice to b at 1500): a waits
# for c to end. Was: a re-cut GPU 0 back at 800, then drained it for itself, and c waited on.
VICTIM_KEEPS_OFF: Table = [
    (0, sub(*[job(x).mig("4g.40gb").checkpointable().build() for x in "ab"]), [_cut4(0)]),
    (30, [MigReconfigured(0)], [_bind4("a", 0), _cut4(1)]),
    (60, [MigReconfigured(1)], [_bind4("b", 1)]),
    (700, sub(job("c").mig(SEVEN_G).build()), [notice("a", 0, "c", 820.0)]),
    (760, [CheckpointAck("a")], [stop("a")]),
    (760, [JobStopped("a")], [Requeue("a", Reason.MIG_DEFRAG, 2, "back in its queue"), recut(0)]),
    (790, [MigReconfigured(0)], [bind("c", 0, SEVEN_G, 0)]),
    (1500, [Tick()], []),
    (1600, [JobFinished("c")], [_cut4(0)]),
    (1630, [MigReconfigured(0)], [_bind4("a", 0)]),
]


def test_a_victim_does_not_take_back_the_gpu_it_was_stopped_for() -> None:
    mig = MigConfig(layout=(), dynamic=True, reconfigure_delay_s=30.0, defrag_budget=2)
    c = (
        ClusterBuilder()
        .nodes("n", 1, gpus=2)
        .partition("m", ["n"], sharing=SharingMode.MIG, mig=mig)
        .build()
    )
    s = make(c)
    for t, events, want in VICTIM_KEEPS_OFF:
        assert s.step(list(events), t) == list(want), f"at t={t:g}"


def test_a_defrag_stop_counts_as_a_preemption_in_metrics_and_accounting() -> None:
    """gpufence_preemptions_total{reason="mig-defrag"}, the store's per-job preemption count and
    the GPU-hours-lost cause all read telemetry.incidents.PREEMPTION_REASONS."""
    from gpufence.telemetry.incidents import PREEMPTION_REASONS, loss_cause

    assert str(Reason.MIG_DEFRAG) in PREEMPTION_REASONS
    assert loss_cause(str(Reason.MIG_DEFRAG)) == "preemption"
