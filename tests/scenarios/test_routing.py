"""Routing (issue 13, item 3): a job that names neither partition nor queue goes to the first
partition admitting its class that could ever hold it, and is rejected only when none could."""

from __future__ import annotations

from scenario_harness import A, make, sub

from gpufence.model.decisions import Bind, Reason, Reject
from gpufence.model.job import WorkloadClass as W
from gpufence.testing.builders import ClusterBuilder, MigConfig, SharingMode, job


def cluster():  # type: ignore[no-untyped-def]
    """notebooks (MIG, first in the spec), training (whole GPUs), batch (fractional): all three
    admit batch work."""
    return (
        ClusterBuilder()
        .nodes("m", 1, gpus=1, gpu_type="A100-40GB")
        .nodes("t", 1, gpus=4)
        .nodes("b", 1, gpus=2)
        .partition(
            "notebooks",
            ["m"],
            admits=frozenset({W.INTERACTIVE, W.BATCH}),
            sharing=SharingMode.MIG,
            mig=MigConfig(layout=("1g.5gb",) * 7),
        )
        .partition("training", ["t"], admits=frozenset({W.TRAINING, W.BATCH}))
        .partition("batch", ["b"], admits=frozenset({W.BATCH}), sharing=SharingMode.FRACTIONAL)
        .build()
    )


def test_a_whole_gpu_batch_job_skips_the_mig_partition() -> None:
    s = make(cluster())
    assert s.step(sub(job("e").gpus(1).cls("batch").build()), 0.0) == [
        Bind("e", "training", (A(1, 1),))
    ]


def test_a_fraction_goes_where_gpus_are_shared_by_fraction() -> None:
    s = make(cluster())
    got = s.step(sub(job("f").fraction(500).cls("batch").build()), 0.0)
    assert [(d.job_id, d.partition) for d in got if isinstance(d, Bind)] == [("f", "batch")]


def test_a_mig_request_goes_to_the_mig_partition() -> None:
    s = make(cluster())
    got = s.step(sub(job("m").mig("1g.5gb").cls("batch").build()), 0.0)
    assert [(d.job_id, d.partition) for d in got if isinstance(d, Bind)] == [("m", "notebooks")]


def test_rejected_only_when_no_admitting_partition_could_ever_hold_it() -> None:
    s = make(cluster())
    got = s.step(sub(job("big").gpus(8).cls("batch").build()), 0.0)
    assert got == [
        Reject(
            "big",
            Reason.NEVER_FITS,
            "no partition admitting batch can hold it (training: a replica needs 8 GPUs on "
            "one node; nodes of training have at most 4; batch: a replica needs 8 GPUs on one "
            "node; nodes of batch have at most 2)",
        )
    ]


def test_a_job_naming_its_partition_is_not_rerouted() -> None:
    s = make(cluster())
    got = s.step(sub(job("e").gpus(1).cls("batch").partition("notebooks").build()), 0.0)
    assert got == [Reject("e", Reason.NEVER_FITS, "partition notebooks only offers MIG instances")]
