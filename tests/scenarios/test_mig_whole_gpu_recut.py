"""Re-cuts that take whole GPUs (``MigConfig.recut_busy=False``: the GPU operator's MIG manager
re-creates every instance of a GPU it re-cuts, so on Kubernetes a GPU with a running instance
is never re-cut), and a re-cut a restarted front end finds in flight (``MigLayoutRead`` with
``recutting``): the job waits for it, no second re-cut is asked for."""

from __future__ import annotations

from scenario_harness import A, JobFinished, MigReconfigured, make, sub

from gpufence.model.decisions import Bind, MigReconfigure, Reason
from gpufence.model.events import MigLayoutRead
from gpufence.testing.builders import ClusterBuilder, MigConfig, SharingMode, job

SEVEN_1G = ("1g.10gb",) * 7
CUT_3G = ("1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4")


def cluster(recut_busy: bool):  # type: ignore[no-untyped-def]
    """Two 1-GPU H100 nodes of a dynamic MIG partition m, each cut 7 x 1g."""
    mig = MigConfig(layout=SEVEN_1G, dynamic=True, reconfigure_delay_s=30.0, recut_busy=recut_busy)
    return (
        ClusterBuilder()
        .nodes("n", 2, gpus=1)
        .partition("m", ["n"], sharing=SharingMode.MIG, mig=mig)
        .build()
    )


def bind(jid: str, gpu: int, profile: str, start: int) -> Bind:
    return Bind(jid, "m", (A(gpu, gpu, mig_profile=profile, mig_start=start),))


def _both_busy(recut_busy: bool):  # type: ignore[no-untyped-def]
    """a on GPU 0, e (3g) on GPU 1 after its re-cut: both GPUs hold a running instance."""
    s = make(cluster(recut_busy))
    assert s.step(sub(job("a").mig("1g.10gb").build()), 0) == [bind("a", 0, "1g.10gb", 6)]
    got = s.step(sub(job("e").mig("3g.40gb").build()), 1)
    assert [(d.gpu, d.layout) for d in got if isinstance(d, MigReconfigure)] == [
        (1, CUT_3G) if not recut_busy else (0, AROUND_1G6)
    ]
    return s


AROUND_1G6 = ("3g.40gb@0", "1g.10gb@4", "1g.10gb@5", "1g.10gb@6")


def test_a_busy_gpu_is_recut_around_its_instance_where_that_is_allowed() -> None:
    _both_busy(recut_busy=True)  # (the re-cut for e takes GPU 0, around a's 1g@6)


def test_only_an_idle_gpu_is_recut_where_recuts_take_whole_gpus() -> None:
    s = _both_busy(recut_busy=False)
    assert s.step([MigReconfigured(1)], 31) == [bind("e", 1, "3g.40gb", 4)]
    # both GPUs now hold a running instance: a 4g job waits and no GPU is re-cut under them
    assert s.step(sub(job("b").mig("4g.40gb").build()), 40) == []
    why = s.why_pending("b")
    assert why is not None and why.message.endswith(
        "no idle GPU in m to re-cut for 4g.40gb, a re-cut takes a whole GPU "
        "(GPU 0 on n-0 runs a; GPU 1 on n-1 runs e)"
    ), why
    assert s.step([], 400) == []
    # once a GPU is idle it is re-cut for b
    got = s.step([JobFinished("a")], 500)
    assert [d.gpu for d in got if isinstance(d, MigReconfigure)] == [0]


def test_a_recut_in_flight_at_a_restart_is_waited_for_not_asked_again() -> None:
    s = make(cluster(recut_busy=False))
    got = s.step(
        [MigLayoutRead(1, CUT_3G, recutting=True), *sub(job("b").mig("3g.40gb").build())], 0
    )
    assert got == []
    why = s.why_pending("b")
    assert why is not None and why.reason is Reason.RECONFIGURING, why
    assert 1 in s.ledger.blocked
    assert s.step([MigReconfigured(1)], 5) == [bind("b", 1, "3g.40gb", 4)]
