"""A sharing mode's placement is one entry of ``sched/registry.PLACERS`` (issue 33): the
partition walk asks the mode whether its gangs reserve and whether it can make room for a job
that does not fit, instead of testing the modes it knows."""

from __future__ import annotations

import pytest
from scenario_harness import A, flat, make, sub

from gpufence.model.decisions import Bind, PendingReason, Reason
from gpufence.model.partition import SharingMode
from gpufence.sched import registry
from gpufence.sched.jobs import JobRecord
from gpufence.sched.placement.fit import NotPlaced
from gpufence.sched.placing import Placing
from gpufence.sched.scheduler import Scheduler
from gpufence.testing.builders import ClusterBuilder, job


def _one_node() -> Scheduler:
    return make(ClusterBuilder().nodes("n", 1, gpus=8).partition("p", ["n"]).build())


STREAM = [
    (0, sub(job("r").gpus(6).est(100).build())),
    (1, sub(job("g").gpus(8).build())),
    (2, sub(job("t").gpus(1).build())),
]


def test_whole_gpu_gangs_reserve_because_their_mode_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = _one_node()
    assert flat(s, STREAM) == [Bind("r", "p", (A(0, 0, 1, 2, 3, 4, 5),))]
    held = PendingReason(Reason.RESERVED_FOR_GANG, "GPUs reserved for gang g (starts by t=100)")
    assert s.why_pending("t") == held

    # the same mode without reservations: nothing holds GPUs for g, t takes one
    whole = registry.PLACERS[SharingMode.EXCLUSIVE]
    monkeypatch.setitem(
        registry.PLACERS, SharingMode.EXCLUSIVE, registry.PlacementMode(whole.placer)
    )
    s = _one_node()
    assert flat(s, STREAM) == [
        Bind("r", "p", (A(0, 0, 1, 2, 3, 4, 5),)),
        Bind("t", "p", (A(0, 6),)),
    ]


def test_a_mode_that_can_make_room_is_asked_when_a_job_does_not_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    def recut(st: Placing, rec: JobRecord, r: NotPlaced) -> str | NotPlaced:
        asked.append(rec.job.id)
        return "waiting for the test's re-cut" if rec.job.id == "big" else r

    whole = registry.PLACERS[SharingMode.EXCLUSIVE]
    mode = registry.PlacementMode(whole.placer, reserves=False, recut=recut)
    monkeypatch.setitem(registry.PLACERS, SharingMode.EXCLUSIVE, mode)
    s = _one_node()
    flat(
        s,
        [
            (0, sub(job("r").gpus(8).est(100).build())),
            (1, sub(job("big").gpus(4).build())),
            (2, sub(job("small").gpus(2).build())),
        ],
    )
    assert set(asked) == {"big", "small"}  # (each cycle that walks them asks again)
    assert s.why_pending("big") == PendingReason(
        Reason.RECONFIGURING, "waiting for the test's re-cut"
    )
    small = s.why_pending("small")
    assert small is not None and small.reason is Reason.NO_FIT
