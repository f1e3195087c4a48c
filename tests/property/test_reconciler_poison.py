"""Issue 11, case 2 (property): random batches with poisoned items never lose a non-poisoned
observation.

A real reconciler on a real SQLite store drives the real scheduler (``ReconcilerRig``); the
executor is the in-memory ``FakeExecutor``, on which the test decides when attempts end (a
stopped attempt ends at once). Each example starts
a few jobs, then hands the reconciler one shuffled batch mixing good observations (the exits of
running jobs, node events) with poison: submits the scheduler cannot reason about (infinite or
huge numbers that bypassed the API's validation), exits and acks for jobs or attempts that do
not exist, unknown nodes, queries that raise, and a restore that contradicts the ledger (the
scheduler raises on it). After the batch every good exit is persisted, its job has ended in the
store and in the scheduler, and its GPUs are free; nothing escapes the cycle.
"""

from __future__ import annotations

import math
import random
import tempfile
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from gpufence.control.base.executor import AttemptExit
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.reconciler import Reconciler
from gpufence.control.reconciler.inbox import Ack, Call, Item, NodeEvent, Submit, SubmitResult
from gpufence.control.store import database as st
from gpufence.model.decisions import Assignment
from gpufence.model.events import JobRestored
from gpufence.sched.jobs import TERMINAL
from gpufence.testing.builders import job
from gpufence.testing.fake_executor import FakeExecutor, StopCall
from gpufence.testing.reconciler_rig import ReconcilerRig

SPEC: dict[str, Any] = {
    "name": "poison",
    "node_groups": [{"name": "local", "count": 1, "gpus_per_node": 8, "gpu_type": "H100-80GB"}],
    "partitions": {"p": {"nodes": ["local"], "admits": ["training"], "sharing": "exclusive"}},
}


def make(tmp: Path) -> ReconcilerRig:
    """One node of 8 fake GPUs, one partition; a stopped attempt ends at once (SIGTERM)."""
    ex = FakeExecutor()
    ex.on_stop = lambda call: _end_stopped(ex, call)
    return ReconcilerRig.make(tmp, SPEC, executor=ex)


def _end_stopped(ex: FakeExecutor, call: StopCall) -> None:
    if ex.is_running(call.job_id, call.attempt):
        ex.exit(call.job_id, call.attempt, (-15,))


def drain(rig: ReconcilerRig) -> None:
    """Run the cycles that what the reconciler queued for itself (failed launches, the exits of
    stopped attempts) needs."""
    for _ in range(5):
        items = rig.items()
        if not items:
            return
        rig.rec.cycle(items)


def request(**fields: Any) -> SubmitRequest:
    return SubmitRequest(command=["true"], **fields)


def poisoned_request(kind: int) -> SubmitRequest:
    """Requests the API would refuse, as a bug or an older store could still produce them."""
    bad: list[dict[str, Any]] = [
        {"est_runtime_s": math.inf},
        {"est_runtime_s": math.nan},
        {"gpu_fraction": 0.5, "gpu_mem_gib": 1e308},  # OverflowError in request()
        {"priority": 10**30},
        {"replicas": 0},
    ]
    return SubmitRequest.model_construct(command=["true"], **bad[kind % len(bad)])


def raising_call(_rec: Reconciler) -> None:
    raise RuntimeError("a query that fails")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_jobs=hs.integers(1, 6),
    n_exit=hs.integers(0, 6),
    poison=hs.lists(hs.integers(0, 7), max_size=8),
    seed=hs.integers(0, 2**16),
)
def test_poisoned_items_never_cost_a_good_observation(
    n_jobs: int, n_exit: int, poison: list[int], seed: int
) -> None:
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="gpf-poison-") as tmp:
        rig = make(Path(tmp))
        rec, ex = rig.rec, rig.ex
        try:
            futs: list[Future[SubmitResult]] = [Future() for _ in range(n_jobs)]
            rec.cycle([Submit(request(gpus=rnd.choice((1, 2))), "t", f) for f in futs])
            drain(rig)
            ids = [f.result(0).job_id for f in futs]
            running = [k for k in ex.running() if k[0] in ids]
            ending = running[: min(n_exit, len(running))]
            for (j, a), ok in ((k, rnd.random() < 0.5) for k in ending):
                ex.exit(j, a, (0 if ok else 3,))  # the processes end; the reports wait
            good = rig.items()
            bad: list[Item] = []
            for p in poison:
                if p < 5:
                    bad.append(Submit(poisoned_request(p), "t", Future()))
                elif p == 5:
                    bad += [AttemptExit("j999", 1, True, (0,), False), Ack("j999", 7)]
                    bad.append(AttemptExit(ids[0], 99, True, (0,), False))  # wrong attempt
                elif p == 6:
                    bad += [NodeEvent("no-such-node", False), Call(raising_call, Future())]
                else:  # the scheduler raises on a restore that contradicts the ledger
                    held = next(iter(rec.scheduler.ledger.allocs.values()), None)
                    gpus = held.assignments[0].gpus if held else (0,)
                    rec.boot(
                        [
                            JobRestored(
                                job=job("ghost").gpus(len(gpus)).build(),
                                pool="p",
                                assignments=(Assignment(0, gpus),),
                            )
                        ],
                        [],
                    )
            batch = good + bad
            rnd.shuffle(batch)
            rec.cycle(batch)
            drain(rig)

            with rec.store.reader() as r:
                for it in good:
                    assert isinstance(it, AttemptExit)
                    row = r.job(it.job_id)
                    assert row is not None
                    want = st.DONE if it.succeeded else st.FAILED
                    assert row.state == want, (it, row.state)
                    att = r.attempt(it.job_id, it.attempt)
                    assert att is not None and att.exit_codes == list(it.codes)
                    core = rec.scheduler.jobs()[it.job_id]
                    assert core.state in TERMINAL
                    assert it.job_id not in rec.scheduler.ledger.allocs
                    assert it.job_id not in rec.live
                # the ones still running are untouched: running in store and scheduler
                for j, _a in ex.running():
                    row = r.job(j)
                    assert row is not None and row.state == st.RUNNING, row
                    assert j in rec.scheduler.ledger.allocs
            assert "ghost" not in rec.scheduler.jobs() or "ghost" in rec.poisoned
            # a poisoned batch did not wedge anything: a new job still gets GPUs when free
            fut: Future[SubmitResult] = Future()
            rec.cycle([Submit(request(gpus=1), "t", fut)])
            drain(rig)
            busy = sum(len(a.assignments[0].gpus) for a in rec.scheduler.ledger.allocs.values())
            assert fut.result(0).state in (st.PENDING, st.RUNNING)
            assert busy <= 8
        finally:
            rec.store.close()
