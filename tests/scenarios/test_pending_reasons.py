"""Why pending: every waiting job has a machine-readable reason and a sentence; jobs that can
never run are rejected at submit with the reason."""

from __future__ import annotations

import pytest
from scenario_harness import A, JobFinished, flat, make, sub

from gpufence.model.decisions import Bind, PendingReason, Reason, Reject
from gpufence.model.job import Job
from gpufence.model.job import WorkloadClass as W
from gpufence.sched.jobs import JobState
from gpufence.testing.builders import ClusterBuilder, MigConfig, SharingMode, job


def cluster():  # type: ignore[no-untyped-def]
    """train: 2 nodes x 4 H100 (GPUs 0-7); notebooks: 1 node x 2 (8-9); mig: 1 A100-40GB (10),
    dynamic layout (so a missing profile waits for a re-partition instead of being rejected)."""
    return (
        ClusterBuilder()
        .nodes("t", 2, gpus=4, cpu_cores=32, mem_gib=256)
        .nodes("nb", 1, gpus=2)
        .nodes("m", 1, gpus=1, gpu_type="A100-40GB")
        .partition("train", ["t"], admits=frozenset({W.TRAINING, W.BATCH}))
        .partition("notebooks", ["nb"], admits=frozenset({W.INTERACTIVE}))
        .partition(
            "mig",
            ["m"],
            admits=frozenset({W.BATCH}),
            sharing=SharingMode.MIG,
            mig=MigConfig(layout=("3g.20gb", "3g.20gb"), dynamic=True),
        )
        .queue("team-a", "train", nominal_milli=4000, borrowing_limit_milli=2000)
        .queue("team-b", "train", nominal_milli=4000)
        .queue("team-c", "train")
        .build()
    )


REJECT_CASES = [
    pytest.param(
        job("x").partition("nowhere").build(),
        Reason.INVALID,
        "partition 'nowhere' does not exist (known: mig, notebooks, train)",
        id="unknown partition",
    ),
    pytest.param(
        job("x").queue("team-z").build(),
        Reason.INVALID,
        "queue 'team-z' does not exist (known: mig, notebooks, team-a, team-b, team-c)",
        id="unknown queue",
    ),
    pytest.param(
        job("x").cls("serving").build(),
        Reason.FENCE,
        "no partition admits serving work",
        id="no partition admits the class",
    ),
    pytest.param(
        job("x").cls("interactive").partition("train").build(),
        Reason.FENCE,
        "partition train does not admit interactive (partitions admitting interactive: notebooks)",
        id="class not admitted by the named partition",
    ),
    pytest.param(
        job("x").queue("team-a").partition("notebooks").cls("interactive").build(),
        Reason.INVALID,
        "queue team-a belongs to partition train, not notebooks",
        id="queue of another partition",
    ),
    pytest.param(
        job("x").gpus(5).queue("team-b").build(),
        Reason.NEVER_FITS,
        "a replica needs 5 GPUs on one node; nodes of train have at most 4",
        id="too many GPUs per node",
    ),
    pytest.param(
        job("x").gang(3, 4).queue("team-b").build(),
        Reason.NEVER_FITS,
        "gang needs 12 GPUs; partition train has 8",
        id="gang larger than the partition",
    ),
    pytest.param(
        job("x").gang(0, 1).build(),
        Reason.INVALID,
        "replicas must be >= 1 (got 0)",
        id="zero replicas",
    ),
    pytest.param(
        job("x").mig("3g.40gb").cls("batch").partition("mig").build(),
        Reason.NEVER_FITS,
        "MIG profile '3g.40gb' does not exist on A100-40GB (valid: 1g.5gb, 1g.5gb+me, 1g.10gb, "
        "2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)",
        id="MIG profile not on the hardware",
    ),
    pytest.param(
        job("x").fraction(500, 1024).queue("team-b").build(),
        Reason.NEVER_FITS,
        "partition train does not share GPUs by fraction",
        id="fraction in a non-fractional partition",
    ),
    pytest.param(
        job("x").gpus(1).types("A100-40GB").queue("team-b").build(),
        Reason.NEVER_FITS,
        "GPU types A100-40GB not in partition train (has H100-80GB)",
        id="GPU type constraint the partition cannot meet",
    ),
    pytest.param(
        job("x").gpus(1).cpu(64_000).queue("team-b").build(),
        Reason.NEVER_FITS,
        "a replica needs more CPU/memory than any node of train",
        id="more CPU than any node",
    ),
    pytest.param(
        job("x").gpus(4).gang(2, 4).queue("team-a").build(),
        Reason.NEVER_FITS,
        "needs 8 GPUs but queue team-a may hold at most 6",
        id="more than nominal quota plus borrowing limit",
    ),
]


@pytest.mark.parametrize(("bad", "reason", "message"), REJECT_CASES)
def test_reject_at_submit(bad: Job, reason: Reason, message: str) -> None:
    s = make(cluster())
    assert s.step(sub(bad), 0) == [Reject("x", reason, message)]
    assert s.job("x").state is JobState.REJECTED
    assert s.why_pending("x") is None
    assert s.pending_count() == 0


def test_duplicate_id_is_rejected_and_the_original_keeps_running() -> None:
    s = make(cluster())
    got = flat(
        s,
        [
            (0, sub(job("a").gpus(1).queue("team-b").build())),
            (1, sub(job("a").gpus(2).queue("team-b").build())),
        ],
    )
    assert got == [
        Bind("a", "train", (A(0, 0),)),
        Reject("a", Reason.DUPLICATE, "job id a already used"),
    ]
    assert s.job("a").state is JobState.RUNNING
    assert s.job("a").job.request.gpus == 1


def test_duplicate_of_a_rejected_id_is_still_a_duplicate() -> None:
    s = make(cluster())
    s.step(sub(job("x").partition("nowhere").build()), 0)
    assert s.step(sub(job("x").gpus(1).queue("team-b").build()), 1) == [
        Reject("x", Reason.DUPLICATE, "job id x already used")
    ]


def test_job_without_queue_or_partition_goes_to_the_first_admitting_partition() -> None:
    s = make(cluster())
    got = s.step(sub(job("nb").gpus(1).cls("interactive").build()), 0)
    assert got == [Bind("nb", "notebooks", (A(2, 8),))]
    assert (s.job("nb").home, s.job("nb").queue) == ("notebooks", "notebooks")


PENDING_CASES = [
    pytest.param(
        [job("f").gang(2, 4).queue("team-c").build()],
        job("w").gpus(1).queue("team-c").build(),
        PendingReason(Reason.NO_FIT, "needs 1 free GPU, partition train has 0 free"),
        id="no-fit when the partition is full",
    ),
    pytest.param(
        [job("f0").gpus(3).queue("team-c").build(), job("f1").gpus(3).queue("team-c").build()],
        job("w").gpus(2).queue("team-c").build(),
        PendingReason(
            Reason.FRAGMENTED,
            "2 GPUs free in train but not 1 x 2 on usable nodes; GPUs reserved from when "
            "running jobs end",
        ),
        id="fragmented when free GPUs are scattered",
    ),
    pytest.param(
        [job(f"a{i}").gpus(1).queue("team-a").build() for i in range(6)],
        job("w").gpus(1).queue("team-a").build(),
        PendingReason(Reason.QUOTA, "queue team-a would use 7 GPUs: nominal 4 + borrowing limit 2"),
        id="quota when the queue is at nominal plus borrowing",
    ),
    pytest.param(
        [job("f").mig("3g.20gb").cls("batch").partition("mig").build()],
        # (a 1g.5gb would be cut beside f; a 7g needs the whole GPU)
        job("w").mig("7g.40gb").cls("batch").partition("mig").build(),
        PendingReason(
            Reason.MIG_LAYOUT,
            "0 free 7g.40gb instances in mig (needs 1); 1 free instances of other profiles; "
            "no GPU in mig can be re-cut for 7g.40gb beside its running instances "
            "(GPU 10: @0 under f)",
        ),
        id="mig-layout when only other profiles are free",
    ),
]


@pytest.mark.parametrize(("before", "waiting", "why"), PENDING_CASES)
def test_why_pending(before: list[Job], waiting: Job, why: PendingReason) -> None:
    s = make(cluster())
    first = s.step(sub(*before), 0)
    assert [d.job_id for d in first] == [j.id for j in before]
    assert s.step(sub(waiting), 1) == []
    assert s.why_pending(waiting.id) == why


def test_why_pending_is_none_for_running_finished_and_unknown_jobs() -> None:
    s = make(cluster())
    s.step(sub(job("a").gpus(1).queue("team-b").build()), 0)
    assert s.why_pending("a") is None
    s.step([JobFinished("a")], 1)
    assert s.job("a").state is JobState.DONE
    assert s.why_pending("a") is None
    assert s.why_pending("never-submitted") is None


def test_reason_clears_when_the_job_starts() -> None:
    s = make(cluster())
    got = flat(
        s,
        [
            (0, sub(job("f").gang(2, 4).queue("team-b").build())),
            (1, sub(job("w").gpus(1).queue("team-b").build())),
        ],
    )
    assert s.why_pending("w") is not None
    got = s.step([JobFinished("f")], 2)
    assert got == [Bind("w", "train", (A(0, 0),))]
    assert s.why_pending("w") is None
