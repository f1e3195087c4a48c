"""MigLayoutRead: the front end tells the core what MIG instances a GPU really has.

After a failed re-partition the GPU's layout is what was read off the device, the re-partition
in flight is dropped and the job it was for is placed again in the same step; at start-up the
layout read replaces the spec's; a GPU whose MIG mode does not match its partition is taken out
of placement; a layout the hardware could not have is never taken.
"""

from __future__ import annotations

from scenario_harness import A, MigReconfigured, Tick, make, sub

from gpufence.model.decisions import Bind, MigReconfigure, Reason
from gpufence.model.events import MigLayoutRead
from gpufence.model.mig import MigInstance
from gpufence.testing.builders import ClusterBuilder, MigConfig, SharingMode, job


def cluster(layout: tuple[str, ...] = ("3g.40gb", "3g.40gb"), dynamic: bool = True):  # type: ignore[no-untyped-def]
    mig = MigConfig(layout=layout, dynamic=dynamic, reconfigure_delay_s=30.0)
    return (
        ClusterBuilder()
        .nodes("n", 1, gpus=2)
        .partition("m", ["n"], sharing=SharingMode.MIG, mig=mig)
        .build()
    )


def inst(gpu: int, profile: str, start: int) -> A:  # type: ignore[valid-type]
    return A(0, gpu, mig_profile=profile, mig_start=start)


def test_a_failed_repartition_takes_the_layout_read_and_places_the_job_again() -> None:
    s = make(cluster())
    assert s.step(sub(job("a").mig("3g.40gb").build(), job("b").mig("3g.40gb").build()), 0) == [
        Bind("a", "m", (inst(0, "3g.40gb", 4),)),
        Bind("b", "m", (inst(0, "3g.40gb", 0),)),
    ]
    got = s.step(sub(job("c").mig("1g.10gb").build()), 1)
    full = ("3g.40gb@0", "1g.10gb@4", "1g.10gb@5", "1g.10gb@6")
    assert got == [MigReconfigure(1, full, Reason.MIG_LAYOUT, 30.0, got[0].message)]  # type: ignore[union-attr]
    assert 1 in s.ledger.blocked
    # the device ended up with 3g@4 alone (3g@0 destroyed, nothing created); the front end asks
    # again: the core re-partitions the GPU for the waiting job at once, keeping 3g@4
    got = s.step([MigLayoutRead(1, ("3g.40gb@4",), failed="NVML error 999")], 2)
    assert s.ledger.mig[1].instances == [MigInstance("3g.40gb", 4)]
    full = ("1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4")
    assert got == [MigReconfigure(1, full, Reason.MIG_LAYOUT, 30.0, got[0].message)]  # type: ignore[union-attr]
    assert s.step([MigReconfigured(1)], 3) == [Bind("c", "m", (inst(1, "1g.10gb", 0),))]


def test_a_layout_read_that_already_serves_the_job_binds_it() -> None:
    s = make(cluster())
    s.step(sub(job("a").mig("3g.40gb").build(), job("b").mig("3g.40gb").build()), 0)
    s.step(sub(job("c").mig("1g.10gb").build()), 1)
    # part-way: 1g@6 exists although the call after it failed
    got = s.step([MigLayoutRead(1, ("1g.10gb@6",), failed="NVML error 999")], 2)
    assert got == [Bind("c", "m", (inst(1, "1g.10gb", 6),))]
    assert s.ledger.blocked == {}


def test_startup_layout_replaces_the_spec_layout() -> None:
    s = make(cluster(dynamic=False))
    assert s.step([MigLayoutRead(0, ("2g.20gb@0", "1g.10gb@2"))], 0) == []
    assert s.ledger.mig[0].instances == [MigInstance("2g.20gb", 0), MigInstance("1g.10gb", 2)]
    assert s.step(sub(job("a").mig("2g.20gb").build()), 1) == [
        Bind("a", "m", (inst(0, "2g.20gb", 0),))
    ]


def test_an_unusable_gpu_is_never_placed_on_and_never_repartitioned() -> None:
    s = make(cluster())
    s.step([MigLayoutRead(0, (), usable=False), MigLayoutRead(1, (), usable=False)], 0)
    assert s.step(sub(job("a").mig("3g.40gb").build(), job("c").mig("1g.10gb").build()), 1) == []
    assert set(s.ledger.blocked) == {0, 1}
    assert s.step([Tick()], 2) == []


def test_an_impossible_layout_is_not_taken() -> None:
    s = make(cluster())
    s.step([MigLayoutRead(0, ("3g.40gb@0", "4g.40gb@0"))], 0)  # overlapping: not real
    assert s.ledger.mig[0].instances == [MigInstance("3g.40gb", 4), MigInstance("3g.40gb", 0)]
    assert 0 in s.ledger.blocked
