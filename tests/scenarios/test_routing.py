"""Routing (issue 13, item 3): a job that names neither partition nor queue goes to the first
partition admitting its class that could ever hold it, and is rejected only when none could."""

from __future__ import annotations

import pytest
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


def tenant_cluster():  # type: ignore[no-untyped-def]
    """A batch partition (first: routing tries it first) whose only queue is vision's, and a
    training partition whose queues are owned by tenants (vision first)."""
    return (
        ClusterBuilder()
        .nodes("t", 1, gpus=4)
        .nodes("b", 1, gpus=2)
        .partition("batch", ["b"], admits=frozenset({W.BATCH}))
        .partition("training", ["t"], admits=frozenset({W.TRAINING, W.BATCH}))
        .queue("vision", "training", tenant="vision")
        .queue("nlp", "training", tenant="nlp")
        .queue("vision-batch", "batch", tenant="vision")
        .build()
    )


def _queue_of(s, job_id: str) -> str:  # type: ignore[no-untyped-def]
    return str(s.ledger.allocs[job_id].queue)  # the queue its GPUs are charged to


@pytest.mark.parametrize(
    ("tenant", "queue"),
    [
        ("nlp", "nlp"),  # its own queue, although another tenant's comes first
        ("vision", "vision"),
        ("", "vision"),  # the admin's (and a simulation's) job: the partition's first queue
    ],
)
def test_a_job_naming_no_queue_goes_to_its_tenants_queue(tenant: str, queue: str) -> None:
    s = make(tenant_cluster())
    got = s.step(sub(job("j").gpus(1).tenant(tenant).build()), 0.0)
    assert [d.job_id for d in got if isinstance(d, Bind)] == ["j"]
    assert _queue_of(s, "j") == queue


def test_a_tenant_with_no_queue_it_may_use_is_refused_with_the_fix() -> None:
    s = make(tenant_cluster())
    got = s.step(sub(job("j").gpus(1).tenant("audio").build()), 0.0)
    assert got == [
        Reject(
            "j",
            Reason.INVALID,
            "partition training has no queue of tenant audio and none without an owner (its "
            "queues: vision (tenant vision), nlp (tenant nlp)); name a queue you may use with "
            "--queue",
        )
    ]


def test_routing_skips_a_partition_where_the_tenant_has_no_queue() -> None:
    # batch work of nlp pinned to the batch partition, where nlp has no queue, is refused;
    # routed, it lands in training, in nlp's own queue
    s = make(tenant_cluster())
    pinned = job("p").gpus(1).cls("batch").partition("batch").tenant("nlp").build()
    routed = job("r").gpus(1).cls("batch").tenant("nlp").build()
    got = s.step(sub(pinned, routed), 0.0)
    assert [d for d in got if isinstance(d, Reject)] == [
        Reject(
            "p",
            Reason.INVALID,
            "partition batch has no queue of tenant nlp and none without an owner (its "
            "queues: vision-batch (tenant vision)); name a queue you may use with --queue",
        )
    ]
    assert _queue_of(s, "r") == "nlp"


def test_a_queue_labelled_with_no_known_tenant_is_nobodys() -> None:
    # the control plane knows vision and nlp: "ops" labels a queue for fair share only, so
    # audio's job may go there (and may name it, control/plane.py); the simulator (no tenants
    # given) treats every label as a tenant's
    c = (
        ClusterBuilder()
        .nodes("t", 1, gpus=4)
        .partition("training", ["t"], admits=frozenset({W.TRAINING}))
        .queue("ops", "training", tenant="ops")
        .build()
    )
    s = make(c, tenants=frozenset({"vision", "nlp"}))
    s.step(sub(job("j").gpus(1).tenant("audio").build()), 0.0)
    assert _queue_of(s, "j") == "ops"
    got = make(c).step(sub(job("k").gpus(1).tenant("audio").build()), 0.0)
    assert [d.reason for d in got if isinstance(d, Reject)] == [Reason.INVALID]
