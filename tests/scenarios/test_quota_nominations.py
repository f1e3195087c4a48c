"""Quota holds for jobs that wait for victims (lent reclaim, incident preemption) too.

A job is admitted against its queue's quota when the walk reaches it; if it then fails for
capacity, protection may reclaim lent GPUs or preempt for it and it binds later, when the victims
have stopped. Quota used in between (another job of its queue bound after it in the same walk, or
while it waited) must still count: it never binds at home beyond nominal + borrowing limit, and no
borrower is reclaimed for a job its quota no longer admits. Capacity freed by incident preemption
in a donor pool is not charged to the queue (see ``Ledger.allocate``), so there it may still run.
"""

from __future__ import annotations

from typing import Any

import pytest
from scenario_harness import CheckpointAck, JobFinished, JobStopped, Step, Tick, make, run, sub

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Bind, Notice, Reason
from gpufence.model.job import WorkloadClass as W
from gpufence.testing.builders import (
    ClusterBuilder,
    LendingRule,
    PreemptionMode,
    PreemptionPolicy,
    job,
)

SERVING = frozenset({W.SERVING})
TRAINING = frozenset({W.TRAINING})


def lending(sq: dict[str, Any]) -> Cluster:
    """serve: node 0 (GPUs 0-3), queue sq, lends 2 GPUs to train; train: node 1 (GPUs 4-7)."""
    rule = LendingRule(to=("train",), cap_gpus=2, reclaim_deadline_s=60.0)
    return (
        ClusterBuilder()
        .nodes("s", 1, gpus=4)
        .nodes("t", 1, gpus=4)
        .partition("serve", ["s"], admits=SERVING, lending=(rule,), backfill=False)
        .partition("train", ["t"], admits=TRAINING)
        .queue("sq", "serve", **sq)
        .build()
    )


def incident(sq: dict[str, Any]) -> Cluster:
    """serve: node 0 (GPUs 0-3), queues sq and oq, may preempt in train; train: node 1."""
    pol = PreemptionPolicy(
        mode=PreemptionMode.INCIDENT_ONLY, from_partitions=("train",), budget=2, min_runtime_s=0.0
    )
    return (
        ClusterBuilder()
        .nodes("s", 1, gpus=4)
        .nodes("t", 1, gpus=4)
        .partition("serve", ["s"], admits=SERVING, preemption=pol, backfill=False)
        .partition("train", ["t"], admits=TRAINING)
        .queue("sq", "serve", **sq)
        .queue("oq", "serve")
        .build()
    )


def serving(jid: str, gpus: int, queue: str, priority: int = 0) -> Any:
    return job(jid).gpus(gpus).cls("serving").queue(queue).priority(priority).build()


def training(jid: str, gpus: int) -> Any:
    return job(jid).gpus(gpus).cls("training").checkpointable().build()


# b borrows serve's GPUs 0-1; big (3 GPUs) does not fit in the 2 left and is walked before
# small, which then takes one of them: after that, sq holds 1 GPU and big would make it 4
LENT = [
    (0, sub(training("fill", 4), training("b", 2))),
    (1, sub(serving("big", 3, "sq", priority=1), serving("small", 1, "sq"))),
    (2, [CheckpointAck("b")]),
]
LENT_RECLAIMED: list[Step] = [*LENT, (3, [JobStopped("b")])]  # b was told to stop
LENT_KEPT: list[Step] = [*LENT, (3, [Tick()])]  # b was left alone: it keeps running

# serve is full (oq); big gets the incident victim v in train; while v winds down serve frees
# up and small (sq) binds there: home would now take sq to 4 GPUs, train's freed GPUs would not
INCIDENT: list[Step] = [
    (0, sub(serving("o1", 2, "oq"), serving("o2", 2, "oq"), training("v", 4))),
    (1, sub(serving("big", 2, "sq", priority=1))),
    (2, [JobFinished("o1", True), JobFinished("o2", True), *sub(serving("small", 2, "sq"))]),
    (3, [CheckpointAck("v")]),
    (4, [JobStopped("v")]),
]

FREED = "on GPUs of train freed by incident preemption"
QUOTA_3 = "queue sq would use 4 GPUs: nominal 3 + borrowing limit 0"

# spec, nominal quota of sq (borrowing limit 0), steps, jobs noticed, big's bind, why big waits
CASES = [
    pytest.param(
        lending,
        4000,
        LENT_RECLAIMED,
        ["b"],
        ("serve", Reason.FITS, ""),
        None,
        id="lent reclaim: quota left for both, the borrower is reclaimed for big",
    ),
    pytest.param(
        lending,
        3000,
        LENT_KEPT,
        [],
        None,
        QUOTA_3,
        id="lent reclaim: small used big's quota, so nothing is reclaimed and big waits",
    ),
    pytest.param(
        incident,
        4000,
        INCIDENT,
        ["v"],
        ("serve", Reason.FITS, ""),
        None,
        id="incident: quota left, big takes the GPUs freed at home",
    ),
    pytest.param(
        incident,
        3000,
        INCIDENT,
        ["v"],
        ("train", Reason.INCIDENT, FREED),
        None,
        id="incident: small used big's quota, big runs on the freed donor GPUs, not at home",
    ),
]


@pytest.mark.parametrize(("spec", "nominal", "steps", "noticed", "big", "why"), CASES)
def test_quota_holds_for_jobs_waiting_on_victims(  # type: ignore[no-untyped-def]
    spec, nominal, steps, noticed, big, why
) -> None:
    s = make(spec({"nominal_milli": nominal, "borrowing_limit_milli": 0}))  # validation on
    got = [d for ds in run(s, steps) for d in ds]
    assert [d.job_id for d in got if isinstance(d, Notice)] == noticed
    binds = {d.job_id: (d.partition, d.reason, d.message) for d in got if isinstance(d, Bind)}
    assert binds["small"] == ("serve", Reason.FITS, "")
    assert binds.get("big") == big
    assert s.ledger.queue_used["sq"] <= nominal
    pending = s.why_pending("big")
    if why is None:
        assert pending is None
    else:
        assert pending is not None and (pending.reason, pending.message) == (Reason.QUOTA, why)
