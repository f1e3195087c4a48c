"""MIG: static layouts per partition; jobs take instances of their profile; dynamic MIG
re-partitions only an idle GPU (MigReconfigure, GPU blocked until MigReconfigured), never one
under a running job."""

from __future__ import annotations

import pytest
from scenario_harness import A, JobFinished, MigReconfigured, Tick, flat, make, sub

from gpufence.model.decisions import Bind, MigReconfigure, PendingReason, Reason, Reject
from gpufence.model.job import Job
from gpufence.model.mig import MigInstance
from gpufence.testing.builders import ClusterBuilder, MigConfig, SharingMode, job


def mig_cluster(
    layout: tuple[str, ...] = ("3g.40gb", "3g.40gb"), dynamic: bool = False, gpus: int = 2
):  # type: ignore[no-untyped-def]
    """One H100 node with ``gpus`` GPUs in MIG partition m (and a whole-GPU partition w)."""
    mig = MigConfig(layout=layout, dynamic=dynamic, reconfigure_delay_s=30.0)
    return (
        ClusterBuilder()
        .nodes("n", 1, gpus=gpus)
        .nodes("w", 1, gpus=2)
        .partition("m", ["n"], sharing=SharingMode.MIG, mig=mig)
        .partition("w", ["w"])
        .build()
    )


def inst(gpu: int, profile: str, start: int) -> A:  # type: ignore[valid-type]
    return A(0, gpu, mig_profile=profile, mig_start=start)


def test_static_layout_is_created_on_every_gpu() -> None:
    s = make(mig_cluster(layout=("3g.40gb", "2g.20gb", "1g.10gb")))
    for g in (0, 1):
        assert s.ledger.mig[g].instances == [
            MigInstance("3g.40gb", 4),
            MigInstance("2g.20gb", 0),
            MigInstance("1g.10gb", 2),
        ]


def test_jobs_take_instances_of_their_profile_packing_busy_gpus_first() -> None:
    s = make(mig_cluster())
    got = s.step(
        sub(
            job("a").mig("3g.40gb").build(),
            job("b").mig("3g.40gb").build(),
            job("c").mig("3g.40gb").build(),
        ),
        0,
    )
    assert got == [
        Bind("a", "m", (inst(0, "3g.40gb", 4),)),
        Bind("b", "m", (inst(0, "3g.40gb", 0),)),
        Bind("c", "m", (inst(1, "3g.40gb", 4),)),
    ]


def test_a_mig_gang_takes_one_instance_per_replica() -> None:
    s = make(mig_cluster())
    got = s.step(sub(job("g").mig("3g.40gb", replicas=3).build()), 0)
    assert got == [
        Bind(
            "g",
            "m",
            (inst(0, "3g.40gb", 4), inst(0, "3g.40gb", 0), inst(1, "3g.40gb", 4)),
        )
    ]


def test_a_mig_gang_larger_than_the_free_instances_waits_whole() -> None:
    s = make(mig_cluster())
    s.step(sub(job("a").mig("3g.40gb").build()), 0)
    assert s.step(sub(job("g").mig("3g.40gb", replicas=4).build()), 1) == []
    assert list(s.ledger.allocs) == ["a"]


def test_freed_instance_is_reused() -> None:
    s = make(mig_cluster(gpus=1))
    got = flat(
        s,
        [
            (0, sub(*[job(f"j{i}").mig("3g.40gb").build() for i in range(3)])),
            (5, [JobFinished("j0")]),
        ],
    )
    assert got == [
        Bind("j0", "m", (inst(0, "3g.40gb", 4),)),
        Bind("j1", "m", (inst(0, "3g.40gb", 0),)),
        Bind("j2", "m", (inst(0, "3g.40gb", 4),)),
    ]


def test_static_mig_jobs_wait_for_a_free_instance_of_their_profile() -> None:
    s = make(mig_cluster())
    got = s.step(sub(*[job(f"x{i}").mig("3g.40gb").build() for i in range(5)]), 0)
    assert [d.job_id for d in got] == ["x0", "x1", "x2", "x3"]
    why = PendingReason(Reason.NO_FIT, "no free 3g.40gb MIG instance in m")
    assert s.why_pending("x4") == why


STATIC = " and its layout is static (mig.dynamic: false)"
REJECT_CASES = [
    pytest.param(
        job("x").mig("1g.10gb").build(),
        "MIG profile '1g.10gb' is not in the layout of partition m (3g.40gb, 3g.40gb)" + STATIC,
        id="a profile missing from a static layout is rejected (it could never run)",
    ),
    pytest.param(
        job("x").mig("3g.40gb", replicas=5).build(),
        "needs 5 3g.40gb instances; partition m has 4" + STATIC,
        id="more replicas than a static layout has instances of the profile is rejected",
    ),
    pytest.param(
        job("x").mig("5g.50gb").partition("m").build(),
        "MIG profile '5g.50gb' does not exist on H100-80GB (valid: 1g.10gb, 1g.10gb+me, "
        "1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)",
        id="a profile the hardware does not have is rejected",
    ),
    pytest.param(
        job("x").mig("3g.20gb").partition("m").build(),
        "MIG profile '3g.20gb' does not exist on H100-80GB (valid: 1g.10gb, 1g.10gb+me, "
        "1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)",
        id="an A100-40GB profile name is rejected on H100",
    ),
    pytest.param(
        job("x").gpus(1).partition("m").build(),
        "partition m only offers MIG instances",
        id="a whole-GPU job in a MIG partition is rejected",
    ),
    pytest.param(
        job("x").mig("3g.40gb").partition("w").build(),
        "partition w is exclusive, not MIG",
        id="a MIG job in a non-MIG partition is rejected",
    ),
]


@pytest.mark.parametrize(("bad", "message"), REJECT_CASES)
def test_mig_rejects(bad: Job, message: str) -> None:
    s = make(mig_cluster())
    assert s.step(sub(bad), 0) == [Reject(bad.id, Reason.NEVER_FITS, message)]


def _busy_gpu0(dynamic: bool = True):  # type: ignore[no-untyped-def]
    s = make(mig_cluster(dynamic=dynamic))
    got = s.step(sub(job("a").mig("3g.40gb").build(), job("b").mig("3g.40gb").build()), 0)
    assert got == [
        Bind("a", "m", (inst(0, "3g.40gb", 4),)),
        Bind("b", "m", (inst(0, "3g.40gb", 0),)),
    ]
    return s


def test_dynamic_mig_repartitions_an_idle_gpu_then_binds() -> None:
    s = _busy_gpu0()
    got = s.step(sub(job("c").mig("1g.10gb").build(), job("e").mig("2g.20gb").build()), 1)
    assert got == [
        MigReconfigure(
            gpu=1,
            # a full layout: the job's 1g, the 2g queued behind it, and the old 3g@0 kept
            layout=("3g.40gb@0", "2g.20gb@4", "1g.10gb@6"),
            reason=Reason.MIG_LAYOUT,
            ready_after_s=30.0,
            message="re-partition idle GPU 1 for pending 1g.10gb demand",
        )
    ]
    assert s.why_pending("c") == PendingReason(Reason.RECONFIGURING, "GPU 1 re-partitioning (30 s)")
    assert s.why_pending("e") == PendingReason(
        Reason.RECONFIGURING, "a GPU is being re-partitioned for 2g.20gb"
    )
    assert 1 in s.ledger.blocked
    # nothing more happens until the front end reports the new layout
    assert s.step([Tick()], 20) == []
    got = s.step([MigReconfigured(1)], 31)
    assert got == [
        Bind("c", "m", (inst(1, "1g.10gb", 6),)),
        Bind("e", "m", (inst(1, "2g.20gb", 4),)),
    ]
    assert 1 not in s.ledger.blocked


def test_gpu_blocked_while_reconfiguring_serves_no_old_instances() -> None:
    s = _busy_gpu0()
    s.step(sub(job("c").mig("1g.10gb").build()), 1)
    assert s.step(sub(job("f").mig("3g.40gb").build()), 2) == []
    # the layout GPU 1 is being cut to keeps its idle 3g@0: f waits for that, not for GPU 1's
    # old instances
    assert s.why_pending("f") == PendingReason(
        Reason.RECONFIGURING, "a GPU is being re-partitioned for 3g.40gb"
    )


def test_dynamic_mig_recuts_around_a_running_job_never_under_it() -> None:
    s = _busy_gpu0()
    assert s.step(sub(job("d").mig("3g.40gb").build()), 1) == [
        Bind("d", "m", (inst(1, "3g.40gb", 4),))
    ]
    # GPU 1's idle 3g@0 is re-cut into 1g instances; d's 3g@4 stays where it is, d runs on
    got = s.step(sub(job("c").mig("1g.10gb").build()), 2)
    assert got == [
        MigReconfigure(
            gpu=1,
            layout=("1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4"),
            reason=Reason.MIG_LAYOUT,
            ready_after_s=30.0,
            message="re-partition GPU 1 around its running 3g.40gb@4 for pending 1g.10gb demand",
        )
    ]
    assert s.why_pending("c") == PendingReason(Reason.RECONFIGURING, "GPU 1 re-partitioning (30 s)")
    got = s.step([MigReconfigured(1)], 32)
    assert got == [Bind("c", "m", (inst(1, "1g.10gb", 0),))]
    st = s.ledger.mig[1]
    assert dict(zip(st.instances, st.occupant, strict=True)) == {
        MigInstance("1g.10gb", 0): "c",
        MigInstance("1g.10gb", 1): None,
        MigInstance("1g.10gb", 2): None,
        MigInstance("1g.10gb", 3): None,
        MigInstance("3g.40gb", 4): "d",
    }
    assert s.step([JobFinished("d")], 40) == []


def test_static_mig_never_reconfigures() -> None:
    s = _busy_gpu0(dynamic=False)
    got = s.step(sub(job("c").mig("1g.10gb").build()), 1)
    assert [(type(d).__name__, d.reason) for d in got] == [("Reject", Reason.NEVER_FITS)]
    assert s.ledger.blocked == {}


def test_unrequested_mig_reconfigured_event_is_ignored() -> None:
    s = _busy_gpu0()
    assert s.step([MigReconfigured(1)], 1) == []
    assert s.ledger.mig[1].instances == [MigInstance("3g.40gb", 4), MigInstance("3g.40gb", 0)]
