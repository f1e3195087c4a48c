"""The core takes run-time queue changes as events (sched/retune.py): a weight changes the
order of the next binds, a quota lowered below what runs stops nothing (and breaks no
invariant: validation is on) but keeps new work waiting, and a raised one admits it at once.
Another scheduler built from the same spec does not see the change."""

from __future__ import annotations

from gpufence.model.decisions import Bind, Reason, Stop
from gpufence.model.events import JobFinished, JobSubmitted, QueueRetuned, TenantsChanged
from gpufence.sched.scheduler import Scheduler, SchedulerConfig
from gpufence.testing.builders import ClusterBuilder, job


def _cluster(borrow: int | None = None) -> object:
    b = ClusterBuilder().nodes("n", 1, gpus=4).partition("p", ["n"])
    kw = {} if borrow is None else {"nominal_milli": 4000, "borrowing_limit_milli": borrow}
    return b.queue("qa", "p", tenant="a", **kw).queue("qb", "p", tenant="b").build()


def _binds(decisions: list[object]) -> list[str]:
    return [d.job_id for d in decisions if isinstance(d, Bind)]


def _order(weight_a: float | None) -> list[str]:
    """qa ran 3 GPUs and qb 1 for 100 s; then one 4-GPU job of each waits for all 4."""
    spec = _cluster()
    s = Scheduler(spec, SchedulerConfig(validate=True))
    s.step(
        [
            JobSubmitted(job("ra").gpus(3).queue("qa").build()),
            JobSubmitted(job("rb").gpus(1).queue("qb").build()),
        ],
        0.0,
    )
    s.step(
        [
            JobSubmitted(job("ga").gpus(4).queue("qa").build()),
            JobSubmitted(job("gb").gpus(4).queue("qb").build()),
        ],
        50.0,
    )
    if weight_a is not None:
        s.step([QueueRetuned("qa", weight_a, None)], 60.0)
    first = _binds(s.step([JobFinished("ra", True), JobFinished("rb", True)], 100.0))
    assert spec.queues["qa"].weight == 1.0  # the caller's spec is never changed
    return first


def test_a_weight_changed_at_run_time_orders_the_next_binds() -> None:
    assert _order(None) == ["gb"]  # qb is owed more
    assert _order(10.0) == ["ga"]  # qa's weight makes its usage count a tenth


def test_a_quota_lowered_below_use_stops_nothing_and_blocks_new_work() -> None:
    s = Scheduler(_cluster(borrow=0), SchedulerConfig(validate=True))
    s.step([JobSubmitted(job(f"r{i}").gpus(1).queue("qa").build()) for i in range(3)], 0.0)
    out = s.step([QueueRetuned("qa", 1.0, 1000), JobSubmitted(job("new").queue("qa").build())], 1.0)
    assert not [d for d in out if isinstance(d, Stop)] and not _binds(out)
    assert s.why_pending("new").reason is Reason.QUOTA
    out = s.step([JobFinished("r0", True)], 2.0)  # 2 of 1 still run: still over quota
    assert not _binds(out)
    assert _binds(s.step([QueueRetuned("qa", 1.0, 4000)], 3.0)) == ["new"]


def test_tenants_changed_makes_a_labelled_queue_its_tenant_s() -> None:
    spec = _cluster()
    s = Scheduler(spec, SchedulerConfig(tenants=frozenset({"a"})))
    s.step([JobSubmitted(job("x").tenant("c").build())], 0.0)
    assert s.job("x").queue == "qb"  # b is no tenant: its queue is nobody's
    s.step([TenantsChanged(frozenset({"a", "b"})), JobSubmitted(job("y").tenant("c").build())], 1.0)
    assert s.job("y").state.value == "rejected"  # every queue is someone's now


def test_a_rival_s_quota_raised_lends_at_once_though_nothing_ran_or_ended() -> None:
    """qa is at its nominal quota and qb, its cohort, has nothing to lend: qa's new job waits.
    Raising qb's quota (nothing bound or ended in between: admission's answer must not be the
    one kept from before) lets qa borrow it the same step."""
    spec = (
        ClusterBuilder()
        .nodes("n", 1, gpus=4)
        .partition("p", ["n"])
        .queue("qa", "p", tenant="a", nominal_milli=1000)
        .queue("qb", "p", tenant="b", nominal_milli=0)
        .build()
    )
    s = Scheduler(spec, SchedulerConfig(validate=True))
    assert _binds(s.step([JobSubmitted(job("r").queue("qa").build())], 0.0)) == ["r"]
    assert not _binds(s.step([JobSubmitted(job("new").queue("qa").build())], 1.0))
    why = s.why_pending("new")
    assert why is not None and why.reason is Reason.QUOTA, why
    assert _binds(s.step([QueueRetuned("qb", 1.0, 1000)], 2.0)) == ["new"]
