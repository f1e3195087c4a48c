"""Fractional GPUs: milli-GPU shares plus GPU memory, CPU/memory per node, a gpu_types
constraint, and the placement policies best-fit / fgd / fence-pack / random."""

from __future__ import annotations

import pytest
from scenario_harness import A, JobFinished, flat, make, sub

from gpufence.model.decisions import Assignment, Bind, Decision, PendingReason, Reason, Reject
from gpufence.model.job import Job
from gpufence.testing.builders import ClusterBuilder, SharingMode, job


def frac_cluster(placement: str = "best-fit", cpu_cores: int = 8):  # type: ignore[no-untyped-def]
    """Partition f: two nodes of 2 H100 (GPUs 0-1 on node 0, 2-3 on node 1)."""
    return (
        ClusterBuilder()
        .nodes("n", 2, gpus=2, cpu_cores=cpu_cores, mem_gib=64)
        .partition("f", ["n"], sharing=SharingMode.FRACTIONAL, placement=placement)
        .build()
    )


def share(node: int, gpu: int, milli: int, mem: int) -> Assignment:
    return A(node, gpu, milli=milli, gpu_mem_mib=mem)


MIX = [
    job("a").fraction(500, 10_000).build(),
    job("b").fraction(300, 1000).build(),
    job("c").fraction(500, 1000).build(),
    job("d").gpus(2).build(),
    job("e").fraction(700, 1000).build(),
]

POLICY_CASES = [
    pytest.param(
        "best-fit",
        [
            Bind("a", "f", (share(0, 0, 500, 10_000),)),
            Bind("b", "f", (share(0, 0, 300, 1000),)),
            Bind("c", "f", (share(0, 1, 500, 1000),)),
            Bind("d", "f", (A(1, 2, 3),)),
        ],
        PendingReason(Reason.FRAGMENTED, "0.7 GPUs free in f, but no GPU fits 700m GPU +1000MiB"),
        id="best-fit packs the tightest GPU and strands 200m + 500m",
    ),
    pytest.param(
        "fgd",
        [
            Bind("a", "f", (share(0, 0, 500, 10_000),)),
            Bind("b", "f", (share(0, 1, 300, 1000),)),
            Bind("c", "f", (share(0, 0, 500, 1000),)),
            Bind("d", "f", (A(1, 2, 3),)),
            Bind("e", "f", (share(0, 1, 700, 1000),)),
        ],
        None,
        id="fgd places to grow expected fragmentation least and fits everything",
    ),
    pytest.param(
        "fence-pack",
        [
            Bind("a", "f", (share(0, 0, 500, 10_000),)),
            Bind("b", "f", (share(0, 1, 300, 1000),)),
            Bind("c", "f", (share(0, 0, 500, 1000),)),
            Bind("d", "f", (A(1, 2, 3),)),
            Bind("e", "f", (share(0, 1, 700, 1000),)),
        ],
        None,
        id="fence-pack keeps a whole node free for the 2-GPU job and fits everything",
    ),
]


@pytest.mark.parametrize(("policy", "expected", "why_e"), POLICY_CASES)
def test_placement_policies(
    policy: str, expected: list[Decision], why_e: PendingReason | None
) -> None:
    s = make(frac_cluster(policy))
    assert s.step(sub(*MIX), 0) == expected
    assert s.why_pending("e") == why_e


def test_random_policy_is_deterministic_for_a_seed() -> None:
    runs = []
    for _ in range(2):
        s = make(frac_cluster("random"), seed=7)
        runs.append(s.step(sub(*MIX), 0))
    assert runs[0] == runs[1]
    assert all(isinstance(d, Bind) for d in runs[0])


def test_shares_on_one_gpu_are_recorded_as_colocated() -> None:
    s = make(frac_cluster())
    s.step(sub(job("a").fraction(500).build(), job("b").fraction(500).build()), 0)
    assert s.ledger.colocated(0) == ("a", "b")
    assert s.ledger.milli[0] == 1000


def test_gpu_memory_limits_sharing_even_with_milli_left() -> None:
    s = make(frac_cluster())
    got = s.step(
        sub(
            job("a").fraction(200, 70_000).build(),
            job("b").fraction(200, 20_000).build(),
        ),
        0,
    )
    # 80 GiB = 81920 MiB: b's 20000 MiB does not fit beside a's 70000 on GPU 0
    assert got == [
        Bind("a", "f", (share(0, 0, 200, 70_000),)),
        Bind("b", "f", (share(0, 1, 200, 20_000),)),
    ]


def test_cpu_per_node_limits_where_shares_go() -> None:
    s = make(frac_cluster(cpu_cores=8))
    got = s.step(
        sub(
            job("a").fraction(100).cpu(6000).build(),
            job("b").fraction(100).cpu(6000).build(),
            job("c").fraction(100).cpu(6000).build(),
        ),
        0,
    )
    assert got == [
        Bind("a", "f", (share(0, 0, 100, 0),)),
        Bind("b", "f", (share(1, 2, 100, 0),)),
    ]
    why = s.why_pending("c")
    assert why is not None and why.reason is Reason.NO_FIT  # GPUs have room, CPUs do not


def test_gpu_types_constraint() -> None:
    c = (
        ClusterBuilder()
        .nodes("h", 1, gpus=1)
        .nodes("a", 1, gpus=1, gpu_type="A100-40GB")
        .partition("f", ["h", "a"], sharing=SharingMode.FRACTIONAL)
        .build()
    )
    s = make(c)
    got = s.step(
        sub(
            job("x").fraction(500).types("A100-40GB").build(),
            job("y").fraction(500).types("A100-40GB").build(),
            job("z").fraction(500).types("A100-40GB").build(),
            job("v").fraction(500).types("V100").build(),
        ),
        0,
    )
    assert got == [
        Reject(
            "v", Reason.NEVER_FITS, "GPU types V100 not in partition f (has A100-40GB, H100-80GB)"
        ),
        Bind("x", "f", (share(1, 1, 500, 0),)),
        Bind("y", "f", (share(1, 1, 500, 0),)),
    ]
    assert s.job("z").state.value == "pending"


def test_whole_gpu_job_needs_untouched_gpus() -> None:
    s = make(frac_cluster())
    got = flat(
        s,
        [
            (0, sub(job("a").fraction(100).build(), job("b").fraction(100).build())),
            (1, sub(job("w").gpus(2).build())),
        ],
    )
    assert got == [
        Bind("a", "f", (share(0, 0, 100, 0),)),
        Bind("b", "f", (share(0, 0, 100, 0),)),
        Bind("w", "f", (A(1, 2, 3),)),
    ]


def test_finished_share_frees_its_milli() -> None:
    s = make(frac_cluster())
    jobs: list[Job] = [job(f"j{i}").fraction(600).build() for i in range(5)]
    got = flat(s, [(0, sub(*jobs)), (1, [JobFinished("j0")])])
    assert [d.job_id for d in got] == ["j0", "j1", "j2", "j3", "j4"]
    assert got[-1] == Bind("j4", "f", (share(0, 0, 600, 0),))


REJECT_CASES = [
    pytest.param(
        job("x").fraction(500, 100_000).build(),
        "needs 100000 MiB GPU memory; largest GPU 81920",
        id="more GPU memory than any GPU",
    ),
    pytest.param(
        job("x").fraction(1000).build(),
        "gpu fraction must be in (0, 1) (got 1000m)",
        id="a fraction of a whole GPU is invalid",
    ),
]


@pytest.mark.parametrize(("bad", "message"), REJECT_CASES)
def test_fractional_rejects(bad: Job, message: str) -> None:
    s = make(frac_cluster())
    got = s.step(sub(bad), 0)
    assert len(got) == 1 and isinstance(got[0], Reject)
    assert got[0].message == message
