"""Issue 11, case 1 (core): a poisoned job is refused with a decision, never raised on.

A non-finite or out-of-range number used to make ``Scheduler.step`` raise (``OverflowError``
converting ``inf`` in backfill), losing every event after it in the batch. Now intake rejects the
job as ``invalid`` naming the field, and the rest of the batch is applied as usual.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from scenario_harness import A, flat, make, sub

from gpufence.model.decisions import Bind, Reason, Reject
from gpufence.model.events import JobRestored
from gpufence.model.job import GpuRequest, Job
from gpufence.testing.builders import ClusterBuilder, job


def cluster():  # type: ignore[no-untyped-def]
    return ClusterBuilder().nodes("n", 1, gpus=8).partition("p", ["n"]).build()


def poisoned(**fields: object) -> Job:
    return replace(job("bad").gpus(1).build(), **fields)  # type: ignore[arg-type]


CASES = [
    pytest.param(poisoned(est_runtime_s=math.inf), "est_runtime_s must be finite", id="inf"),
    pytest.param(poisoned(est_runtime_s=math.nan), "est_runtime_s must be finite", id="nan"),
    pytest.param(poisoned(est_runtime_s=1e300), "est_runtime_s must be between", id="huge"),
    pytest.param(poisoned(est_runtime_s=-5.0), "est_runtime_s must be between", id="negative"),
    pytest.param(poisoned(time_limit_s=math.inf), "time_limit_s must be finite", id="limit"),
    pytest.param(poisoned(submit_time=math.nan), "submit_time must be finite", id="submit"),
    pytest.param(poisoned(priority=10**30), "priority must be between", id="priority"),
    pytest.param(
        poisoned(request=GpuRequest.fraction(500, 10**20)), "gpu_mem_mib must be", id="mem"
    ),
    pytest.param(poisoned(cpu_milli=-1), "cpu_milli must be between", id="cpu"),
]


@pytest.mark.parametrize(("bad", "words"), CASES)
def test_poisoned_job_is_rejected_and_the_batch_goes_on(bad: Job, words: str) -> None:
    s = make(cluster())
    restored = JobRestored(
        job=job("big").gpus(7).build(), pool="p", assignments=(A(0, *range(7)),), attempt=1
    )
    good = job("ok").gpus(1).est(10.0).build()
    # the poisoned job first: the events after it (a restore, a submit) must still be applied
    out = flat(s, [(100.0, [*sub(bad), restored, *sub(good)])])
    assert out == [
        Reject("bad", Reason.INVALID, out[0].message),  # type: ignore[union-attr]
        Bind("ok", "p", (A(0, 7),), Reason.FITS, out[1].message),  # type: ignore[union-attr]
    ]
    assert words in out[0].message  # type: ignore[union-attr]
    assert s.ledger.owner[0] == "big"  # the restored job holds its GPUs
    # and the next step works as usual
    assert flat(s, [(101.0, sub(job("later").gpus(1).build()))]) == []
