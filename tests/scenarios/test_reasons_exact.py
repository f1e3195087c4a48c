"""Pending reasons that name the real blocker, with the numbers that make it true (issue 13,
item 6): GPUs free but held (and for whom), GPU memory, the minimum runtime that blocks a
preemption, a lending rule for checkpointable jobs only, and fair-share ties."""

from __future__ import annotations

from scenario_harness import make, serve_and_train, sub

from gpufence.model.decisions import PendingReason, Reason
from gpufence.model.job import WorkloadClass as W
from gpufence.testing.builders import (
    ClusterBuilder,
    PreemptionMode,
    PreemptionPolicy,
    SharingMode,
    job,
)

SERVING = frozenset({W.SERVING})
TRAINING = frozenset({W.TRAINING})


def test_free_gpus_held_for_a_waiting_job_are_counted_and_named() -> None:
    """r1 (4 GPUs) reclaims ck's 2 lent GPUs and holds the 2 free ones; r2 is told so."""
    s = serve_and_train(lend=2)
    s.step(sub(job("own").gpus(4).build(), job("ck").gpus(2).checkpointable().build()), 0.0)
    s.step(sub(job("r1").gpus(4).cls("serving").build()), 10.0)
    s.step(sub(job("r2").gpus(2).cls("serving").build()), 20.0)
    assert s.why_pending("r2") == PendingReason(
        Reason.NO_FIT,
        "partition serve has 0 of 4 GPUs free (2 held for r1); "
        "gang r1 holds the reservation (when running jobs end)",
    )


def test_a_memory_bound_fraction_is_no_fit_with_the_memory_numbers() -> None:
    s = make(
        ClusterBuilder()
        .nodes("f", 1, gpus=1)
        .partition("f", ["f"], sharing=SharingMode.FRACTIONAL)
        .build()
    )
    s.step(sub(job("a").fraction(200, 61440).build(), job("b").fraction(300, 40960).build()), 0.0)
    assert s.why_pending("b") == PendingReason(
        Reason.NO_FIT,
        "needs 40960 MiB of GPU memory on one GPU; the most free on a GPU of f is 20480 MiB",
    )


def test_a_preemption_blocked_by_the_minimum_runtime_says_so_and_until_when() -> None:
    pol = PreemptionPolicy(
        mode=PreemptionMode.INCIDENT_ONLY, from_partitions=("train",), budget=4, min_runtime_s=600
    )
    s = serve_and_train(pol)
    s.step(sub(job("sv0").gpus(4).cls("serving").build()), 0.0)
    s.step(sub(job("t1").gpus(4).checkpointable().build()), 100.0)
    s.step(sub(job("sv1").gpus(2).cls("serving").build()), 200.0)
    assert s.why_pending("sv1") == PendingReason(
        Reason.MIN_RUNTIME,
        "preempting t1 in train would make room, but jobs run at least min_runtime_s 600 "
        "before they are preempted (these may be from t=700)",
    )
    assert s.next_wakeup() == 700.0  # protection looks again then


def test_a_job_refused_lent_gpus_for_not_checkpointing_is_told_why() -> None:
    s = serve_and_train(lend=4)
    s.step(sub(job("own").gpus(4).build(), job("nc").gpus(2).build()), 0.0)
    assert s.why_pending("nc") == PendingReason(
        Reason.NO_FIT,
        "needs 2 free GPUs, partition train has 0 free; GPUs reserved from when running jobs "
        "end; serve lends 4 idle GPUs to checkpointable jobs only",
    )


def test_fair_share_ties_are_explained_as_ties() -> None:
    s = make(
        ClusterBuilder()
        .nodes("t", 1, gpus=4)
        .queue("a", "p")
        .queue("b", "p")
        .partition("p", ["t"])
        .build()
    )
    s.step(sub(job("x").gpus(1).queue("a").build(), job("y").gpus(1).queue("b").build()), 0.0)
    shares = s.fair_share("p")
    assert [t.queue for t in shares] == ["a", "b"]
    assert shares[1].explanation.startswith("behind a (shares tied at 1.00: ties go by queue")


def test_the_idle_gpus_a_lender_would_lend_are_capped_by_its_rule() -> None:
    """Issue 33, item 10: 'serve lends 4 idle GPUs' where its rule lends at most 2."""
    s = serve_and_train(lend=2)
    s.step(sub(job("own").gpus(4).build(), job("nc").gpus(2).build()), 0.0)
    assert s.why_pending("nc") == PendingReason(
        Reason.NO_FIT,
        "needs 2 free GPUs, partition train has 0 free; GPUs reserved from when running jobs "
        "end; serve lends 2 idle GPUs to checkpointable jobs only",
    )


def test_gpus_stranded_by_cpu_say_what_is_short() -> None:
    """Two 4-GPU nodes of 16 cores: two 1-GPU jobs of 12 cores each take most of a node's CPU,
    so 6 GPUs stay free but no node has 12 cores left for a third. The reason names the CPU
    and memory a replica needs and the most free on a node (FGD's stranded GPUs), not
    "fragmented" GPUs."""
    s = make(
        ClusterBuilder()
        .nodes("n", 2, gpus=4, cpu_cores=16, mem_gib=64)
        .partition("p", ["n"])
        .build()
    )
    jobs = [job(f"j{i}").gpus(1).cpu(12_000, 8192).build() for i in range(3)]
    binds = s.step(sub(*jobs), 0)
    assert [d.job_id for d in binds] == ["j0", "j1"]
    assert s.why_pending("j2") == PendingReason(
        Reason.FRAGMENTED,
        "6 GPUs free in p, but the nodes with 1 of them free lack CPU or memory for a replica "
        "(12 CPUs, 8.0 GiB): the most any of them has free is 4 CPUs and 56.0 GiB",
    )
