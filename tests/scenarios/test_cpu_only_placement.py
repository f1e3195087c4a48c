"""CPU-only replicas (``gpus: 0``) in exclusive partitions (issue 32, item 5): placed by
their CPU on a node with room (the fullest first, so nodes with free GPUs stay whole), never
more at once than a node's cores; one that asks for no CPU is refused (it would hold nothing).
Before, a CPU-only replica was refused outside fractional partitions."""

from __future__ import annotations

from scenario_harness import A, make, sub

from gpufence.model.decisions import Bind, Reason, Reject
from gpufence.model.events import JobFinished
from gpufence.testing.builders import ClusterBuilder, job


def two_nodes():  # type: ignore[no-untyped-def]
    """p: two 2-GPU nodes of 2 cores each."""
    return ClusterBuilder().nodes("n", 2, gpus=2, cpu_cores=2).partition("p", ["n"]).build()


def test_cpu_only_jobs_fill_cores_not_gpus() -> None:
    s = make(two_nodes())
    gpu = s.step(sub(job("g").gpus(2).build()), 0)  # node 0's GPUs all taken
    assert gpu == [Bind("g", "p", (A(0, 0, 1),))]
    cpu = [job(f"c{i}").gpus(0).cpu(1000).build() for i in range(5)]
    got = s.step(sub(*cpu), 1)
    binds = [d for d in got if isinstance(d, Bind)]
    # the node whose GPUs are taken first (best fit), then the other: 2 cores each, no GPU
    assert [(b.job_id, b.assignments) for b in binds] == [
        ("c0", (A(0),)),
        ("c1", (A(0),)),
        ("c2", (A(1),)),
        ("c3", (A(1),)),
    ]
    why = s.why_pending("c4")
    assert why is not None and why.reason is Reason.NO_FIT, why
    assert why.message == "no node of p has 1 CPU free", why
    assert s.ledger.pool_free["p"] == 2  # node 1's GPUs untouched
    got = s.step([JobFinished("c0")], 2)
    assert [d for d in got if isinstance(d, Bind)] == [Bind("c4", "p", (A(0),))]


def test_a_cpu_only_job_asking_for_no_cpu_is_refused() -> None:
    s = make(two_nodes())
    got = s.step(sub(job("c").gpus(0).build()), 0)
    assert got == [
        Reject(
            "c",
            Reason.INVALID,
            "gpus per replica is 0 (a CPU-only replica) but it asks for no CPU; give cpus",
        )
    ]
    got = s.step(sub(job("m").gpus(-1).build()), 0)
    assert got == [Reject("m", Reason.INVALID, "gpus per replica must be >= 0 (got -1)")]
