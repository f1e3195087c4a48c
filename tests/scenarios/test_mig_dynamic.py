"""Dynamic MIG as a lead (issue 33 item 6): re-cuts leave a full layout for the waiting mix,
re-cut around running instances where the placement rules allow it, placement keeps the
largest profile placeable, and the pending reason names the GPUs and the jobs that block."""

from __future__ import annotations

from scenario_harness import A, JobCancelled, JobFinished, MigReconfigured, flat, make, run, sub

from gpufence.model.decisions import Bind, Decision, MigReconfigure, PendingReason, Reason
from gpufence.model.events import Event
from gpufence.testing.builders import ClusterBuilder, MigConfig, SharingMode, job

SEVEN_1G = ("1g.10gb",) * 7


def cluster(gpus: int = 1, layout: tuple[str, ...] = SEVEN_1G):  # type: ignore[no-untyped-def]
    """One H100 node, ``gpus`` GPUs of partition m, dynamic MIG, re-cuts take 30 s."""
    mig = MigConfig(layout=layout, dynamic=True, reconfigure_delay_s=30.0)
    return (
        ClusterBuilder()
        .nodes("n", 1, gpus=gpus)
        .partition("m", ["n"], sharing=SharingMode.MIG, mig=mig)
        .build()
    )


def bind(jid: str, gpu: int, profile: str, start: int) -> Bind:
    return Bind(jid, "m", (A(0, gpu, mig_profile=profile, mig_start=start),))


def recut(gpu: int, layout: tuple[str, ...], message: str) -> MigReconfigure:
    return MigReconfigure(gpu, layout, Reason.MIG_LAYOUT, 30.0, message)


def test_a_recut_for_3g_keeps_the_rest_of_a_7x1g_gpu_cut() -> None:
    """Was: the GPU became ['3g.40gb@4'], then ['1g.10gb@6'] once idle, and b waited forever
    with 'no free 1g.10gb MIG instance'."""
    s = make(cluster())
    got = flat(
        s,
        [
            (0, sub(job("x").mig("3g.40gb").build())),
            (30, [MigReconfigured(0)]),
            (100, sub(job("a").mig("1g.10gb").build())),
            (200, [JobFinished("x")]),
            (300, sub(job("b").mig("1g.10gb").build())),
        ],
    )
    full = ("1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4")
    assert got == [
        recut(0, full, "re-partition idle GPU 0 for pending 3g.40gb demand"),
        bind("x", 0, "3g.40gb", 4),
        bind("a", 0, "1g.10gb", 0),
        bind("b", 0, "1g.10gb", 1),
    ]
    assert [f"{i.profile}@{i.start}" for i in s.ledger.mig[0].instances] == list(full)


PINNED_1G = tuple(f"1g.10gb@{i}" for i in range(7))  # listed in start order, as after a re-cut


def _trickle(big: str, layout: tuple[str, ...] = SEVEN_1G) -> tuple[list[Decision], float | None]:
    """Three 1g jobs run at any time for 5 h: each ends after 1,800 s and a new one arrives as
    it ends, so the GPU is never idle; ``big`` arrives at t=10. Returns the decisions of the
    first 100 s and when ``big`` was bound."""
    s = make(cluster(layout=layout))
    first = sub(*[job(f"t{i}").mig("1g.10gb").build() for i in range(3)])
    steps: list[tuple[float, list[Event]]] = [
        (0, first),
        (10, sub(job("big").mig(big).build())),
        (40, [MigReconfigured(0)]),
    ]
    for k in range(3, 33):  # t_k ends at 600 * k, t_{k+3} arrives
        steps.append(
            (600.0 * k, [JobFinished(f"t{k - 3}"), *sub(job(f"t{k}").mig("1g.10gb").build())])
        )
    early: list[Decision] = []
    bound: float | None = None
    for (t, _), ds in zip(steps, run(s, steps), strict=True):
        if t < 100:
            early.extend(ds)
        if any(isinstance(d, Bind) and d.job_id == "big" for d in ds):
            bound = t
    return early, bound


def test_a_trickle_of_1g_jobs_cannot_keep_a_3g_job_waiting() -> None:
    """Was: big waited the whole 5 h with 4 slices free, as the GPU was never idle."""
    early, bound = _trickle("3g.40gb")
    assert early == [
        bind("t0", 0, "1g.10gb", 6),
        bind("t1", 0, "1g.10gb", 4),
        bind("t2", 0, "1g.10gb", 5),
        recut(
            0,
            ("3g.40gb@0", "1g.10gb@4", "1g.10gb@5", "1g.10gb@6"),
            "re-partition GPU 0 around its running 1g.10gb@4, 1g.10gb@5, 1g.10gb@6 "
            "for pending 3g.40gb demand",
        ),
        bind("big", 0, "3g.40gb", 0),
    ]
    assert bound == 40


def test_1g_jobs_land_where_a_4g_still_fits() -> None:
    """Not smallest-fit (1g@0, 1g@1, 1g@2 taken, so 4g@0, the only 4g start, stays blocked
    while the GPU is busy): the 1g jobs take the far end."""
    early, bound = _trickle("4g.40gb", PINNED_1G)
    assert early == [
        bind("t0", 0, "1g.10gb", 6),
        bind("t1", 0, "1g.10gb", 4),
        bind("t2", 0, "1g.10gb", 5),
        recut(
            0,
            ("4g.40gb@0", "1g.10gb@4", "1g.10gb@5", "1g.10gb@6"),
            "re-partition GPU 0 around its running 1g.10gb@4, 1g.10gb@5, 1g.10gb@6 "
            "for pending 4g.40gb demand",
        ),
        bind("big", 0, "4g.40gb", 0),
    ]
    assert bound == 40


def test_a_1g_job_goes_to_the_busy_gpu_keeping_an_idle_one_for_7g() -> None:
    s = make(cluster(gpus=2))
    got = flat(
        s,
        [
            (0, sub(job("a").mig("1g.10gb").build())),
            (1, sub(job("b").mig("1g.10gb").build(), job("g").mig("7g.80gb").build())),
            (31, [MigReconfigured(1)]),
        ],
    )
    assert got == [
        bind("a", 0, "1g.10gb", 6),
        bind("b", 0, "1g.10gb", 4),
        recut(1, ("7g.80gb@0",), "re-partition idle GPU 1 for pending 7g.80gb demand"),
        bind("g", 1, "7g.80gb", 0),
    ]


def test_the_reason_names_the_gpus_and_the_jobs_that_block() -> None:
    s = make(cluster(gpus=2))
    s.step(sub(*[job(f"j{i}").mig("1g.10gb").build() for i in range(14)]), 0)
    assert s.step(sub(job("big").mig("3g.40gb").build()), 10) == []
    assert s.why_pending("big") == PendingReason(
        Reason.NO_FIT,
        "no free 3g.40gb MIG instance in m; no GPU in m can be re-cut for 3g.40gb beside its "
        "running instances (GPU 0: @0 under j3, j4, j5, j6, @4 under j1, j2, j0; "
        "GPU 1: @0 under j10, j11, j12, j13, @4 under j8, j9, j7)",
    )
    # one 1g job ends on each half of GPU 1: still blocked; then j7..j9 end and 3g@4 is free
    assert s.step([JobFinished("j10"), JobFinished("j8")], 20) == []
    got = s.step([JobFinished("j7"), JobFinished("j9")], 30)
    assert got == [
        recut(
            1,
            ("1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4"),
            "re-partition GPU 1 around its running 1g.10gb@1, 1g.10gb@2, 1g.10gb@3 "
            "for pending 3g.40gb demand",
        )
    ]


def test_a_gpu_is_drained_for_a_7g_job_while_1g_jobs_go_elsewhere() -> None:
    """The pool has slices free but scattered: GPU 1 (one 1g job in the way, against two on
    GPU 0) takes no new job until j7 ends, then is re-cut for the 7g. Was: s6 went to GPU 1 and
    the 7g waited on, with no reason given."""
    s = make(cluster(gpus=2))
    s.step(sub(*[job(f"j{i}").mig("1g.10gb").build() for i in range(8)]), 0)
    s.step([JobFinished(f"j{i}") for i in range(1, 6)], 10)  # GPU 0: j0, j6 run; GPU 1: j7
    assert s.step(sub(job("big").mig("7g.80gb").build()), 20) == []
    drained = "GPU 1 is drained for 7g.80gb (it takes no new job): waiting for j7 to end"
    assert s.why_pending("big") == PendingReason(
        Reason.MIG_LAYOUT,
        f"0 free 7g.80gb instances in m (needs 1); 11 free instances of other profiles; {drained}",
    )
    got = flat(
        s,
        [
            (30, sub(*[job(f"s{i}").mig("1g.10gb").build() for i in range(1, 7)])),
            (600, [JobFinished("j7")]),
            (630, [MigReconfigured(1)]),
        ],
    )
    assert got == [
        bind("s1", 0, "1g.10gb", 2),
        bind("s2", 0, "1g.10gb", 0),
        bind("s3", 0, "1g.10gb", 1),
        bind("s4", 0, "1g.10gb", 4),
        bind("s5", 0, "1g.10gb", 5),
        recut(1, ("7g.80gb@0",), "re-partition idle GPU 1 for pending 7g.80gb demand"),
        bind("big", 1, "7g.80gb", 0),
    ]
    assert s.ledger.blocked == {}


def test_a_drain_ends_when_its_job_leaves_the_queue() -> None:
    s = make(cluster(gpus=2))
    s.step(sub(*[job(f"j{i}").mig("1g.10gb").build() for i in range(8)]), 0)
    s.step([JobFinished(f"j{i}") for i in range(1, 6)], 10)
    s.step(sub(job("big").mig("7g.80gb").build()), 20)
    assert 1 in s.ledger.blocked
    assert s.step([JobCancelled("big")], 30) == []
    assert s.ledger.blocked == {}
    assert s.step(sub(job("s").mig("1g.10gb").build()), 40) == [bind("s", 0, "1g.10gb", 2)]


def test_a_free_instance_is_taken_rather_than_waiting_for_a_recut() -> None:
    """Work conservation (tests/property/test_guarantees.py): GPU 1 was re-cut for b and holds
    b's free 1g.10gb+me. Was: b waited for a second re-cut of GPU 0 around a's 1g (keeping GPU 1
    whole for a 7g) although the instance made for it was free."""
    s = make(cluster(gpus=2, layout=()))
    got = flat(
        s,
        [
            (0, sub(job("a").mig("1g.10gb").build())),
            (1, sub(job("b").mig("1g.10gb+me").build())),
            (30, [MigReconfigured(0)]),
            (31, [MigReconfigured(1)]),
        ],
    )
    assert [d for d in got if isinstance(d, Bind)] == [
        bind("a", 0, "1g.10gb", 6),
        bind("b", 1, "1g.10gb+me", 6),
    ]
    assert not [d for d in got if isinstance(d, MigReconfigure) and d.gpu == 0][1:]


def test_a_gpu_that_frees_up_ends_a_drain() -> None:
    """GPU 1 is drained for the 7g (j7 in the way); j0 and j6 end first, so GPU 0 is re-cut
    for it at once. Was: the 7g waited for j7 on the drained GPU while GPU 0 stood idle."""
    s = make(cluster(gpus=2))
    s.step(sub(*[job(f"j{i}").mig("1g.10gb").build() for i in range(8)]), 0)
    s.step([JobFinished(f"j{i}") for i in range(1, 6)], 10)  # GPU 0: j0, j6 run; GPU 1: j7
    assert s.step(sub(job("big").mig("7g.80gb").build()), 20) == []
    assert s.ledger.blocked == {1: None}
    got = flat(s, [(600, [JobFinished("j0"), JobFinished("j6")]), (630, [MigReconfigured(0)])])
    assert got == [
        recut(0, ("7g.80gb@0",), "re-partition idle GPU 0 for pending 7g.80gb demand"),
        bind("big", 0, "7g.80gb", 0),
    ]
    assert s.ledger.blocked == {}
