"""The one job lifecycle (model/lifecycle.py) held by both front ends: the control plane's store
and the simulator refuse a move the table does not have, and one scenario replayed through
both takes every job through the same states (the control plane's own ``starting`` aside).

The scenario, on 4 fake GPUs (a serving fence of GPU 0 that may preempt checkpointable
training on GPUs 1-3): a service that runs and finishes, a training job preempted by a second
service and requeued (it runs again and finishes), a job too big to ever fit (rejected), one
cancelled while it waits, and the second service.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gpufence.control.base.config import ADMIN, cluster_from_spec_dict, core_tenant
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.gpus.discovery import fake_gpus, node_spec
from gpufence.control.store import database as st
from gpufence.model import lifecycle
from gpufence.model.events import Event
from gpufence.model.lifecycle import JobState as S
from gpufence.sim.runner import JobTrace, Simulation
from gpufence.sim.workloads.records import WorkItem
from gpufence.testing.reconciler_rig import START_S, ReconcilerRig

SERVE: dict[str, Any] = {"command": ["serve"], "class": "serving"}
TRAIN: dict[str, Any] = {"command": ["train"], "gpus": 3, "checkpointable": True}
BIG: dict[str, Any] = {"command": ["big"], "gpus": 8}  # no node has 8 GPUs: rejected
WAITS: dict[str, Any] = {"command": ["train"], "gpus": 3}  # pending until cancelled


def fenced() -> dict[str, Any]:
    """4 fake GPUs: a serving fence of GPU 0 that may preempt checkpointable training (grace
    10 s), training on GPUs 1-3."""
    spec = copy.deepcopy(node_spec(fake_gpus(4)))
    group = spec["node_groups"][0]["name"]
    incident = {"mode": "incident-only", "from": ["training"], "budget": 2, "window_s": 3600}
    spec["partitions"] = {
        "serving": {
            "gpus": [f"{group}:0"],
            "admits": ["serving"],
            "backfill": False,
            "preemption": {**incident, "min_runtime_s": 0, "grace_s": 10},
        },
        "training": {"gpus": [f"{group}:1-3"], "admits": ["training"]},
    }
    spec.pop("queues", None)
    return spec


# ---------------------------------------------------------------------- the table itself
def test_the_table_has_the_same_edges_as_before_it_was_commented() -> None:
    P, SS, R, X = S.PENDING, S.STARTING, S.RUNNING, S.STOPPING
    D, F, C, RC, RJ = S.DONE, S.FAILED, S.CANCELLED, S.RECLAIMED, S.REJECTED
    expected = {
        (P, SS), (P, R), (P, C), (P, RJ), (P, F),
        (SS, R), (SS, X), (SS, D), (SS, F), (SS, C), (SS, P),
        (R, X), (R, D), (R, F), (R, C), (R, P),
        (X, P), (X, RC), (X, F), (X, D), (X, C),
    }  # fmt: skip
    assert set(lifecycle.EDGES) == expected
    assert len(lifecycle.EDGES) == len(expected)  # each edge once
    got = {(old, new) for old, nxt in lifecycle.TRANSITIONS.items() for new in nxt}
    assert got == expected


# ---------------------------------------------------------------------- the store refuses
_NEW: dict[str, Any] = {
    "tenant": "a",
    "spec": {},
    "workload_class": "batch",
    "partition": "p",
    "queue": "q",
    "submitted_at": 1.0,
}


def _write(s: st.Store, job_id: str, **fields: object) -> None:
    with s.transaction() as tx:
        tx.set_job(job_id or tx.add_job(**_NEW), **fields)


def test_the_store_refuses_an_illegal_move_and_writes_nothing(tmp_path: Path) -> None:
    s = st.Store(tmp_path)
    with s.transaction() as tx:
        jid = tx.add_job(**_NEW)
        tx.set_job(jid, state=st.RUNNING)
        tx.set_job(jid, state=st.DONE, ended_at=2.0)
    with pytest.raises(st.IllegalStateChange, match=f"job {jid}: done -> running") as err:
        _write(s, jid, state=st.RUNNING, message="again")
    assert isinstance(err.value, st.StoreError)
    assert (err.value.job_id, err.value.old, err.value.new) == (jid, "done", "running")
    with s.reader() as r:
        row = r.job(jid)
    assert row is not None and (row.state, row.message) == (st.DONE, "")
    with pytest.raises(st.IllegalStateChange, match="pending -> stopping"):
        _write(s, "", state=st.STOPPING)  # a new job: nothing to stop
    with pytest.raises(st.IllegalStateChange, match="done -> no-such-state"):
        _write(s, jid, state="no-such-state")
    with s.reader() as r:
        assert r.counts() == {st.DONE: 1}  # the refused transactions left nothing
    s.close()


def test_the_same_state_again_is_no_move_and_allowed(tmp_path: Path) -> None:
    """A cancel of a job that a preemption is stopping writes ``stopping`` again (with its own
    reason): allowed, and no observer hears of a change."""
    rig = ReconcilerRig.make(tmp_path, fenced())
    changes: list[tuple[str, str]] = []
    rig.store.observers.append(lambda cs: changes.extend((c.job_id, str(c.new)) for c in cs))
    rig.submit(**SERVE)
    train = rig.submit(**TRAIN).job_id
    rig.submit(**SERVE)  # preempts the training job: notice, then stop on its ack
    rig.ex.ack(train)
    rig.cycle()
    assert rig.job(train).state == st.STOPPING
    assert rig.cancel(train) == st.STOPPING
    row = rig.job(train)
    assert (row.state, row.reason, row.cancel_requested) == (st.STOPPING, "cancelled", True)
    assert [new for jid, new in changes if jid == train].count(st.STOPPING) == 1
    rig.ex.exit(train, 1, (-15,))
    rig.cycle()
    assert rig.job(train).state == st.CANCELLED


# ---------------------------------------------------------------------- the simulator refuses
def test_the_simulator_refuses_an_illegal_move() -> None:
    job = SubmitRequest.model_validate(WAITS).to_job("j1", 0.0, "")
    tr = JobTrace(WorkItem(job, 10.0), submitted=0.0)
    tr.move_to(S.RUNNING)
    tr.move_to(S.DONE)
    with pytest.raises(lifecycle.IllegalTransition, match="job j1: done -> running"):
        tr.move_to(S.RUNNING)
    assert tr.state is S.DONE
    with pytest.raises(lifecycle.IllegalTransition, match="running -> reclaimed"):
        JobTrace(WorkItem(job, 10.0), submitted=0.0, state=S.RUNNING).move_to(S.RECLAIMED)


# ---------------------------------------------------------------------- one scenario, both
def _control_plane(tmp_path: Path) -> dict[str, list[str]]:
    """The scenario on the reconciler (real SQLite store, fake executor): each job's states
    as the store's observers heard them, committed."""
    rig = ReconcilerRig.make(tmp_path, fenced())
    seen: dict[str, list[str]] = {}

    def heard(changes: Sequence[st.StateChange]) -> None:
        for c in changes:
            seen.setdefault(c.job_id, []).append(str(c.new))

    rig.store.observers.append(heard)
    serve = rig.submit(**SERVE).job_id  # t=0: runs on the serving GPU
    train = rig.submit(**TRAIN).job_id  # runs on the 3 training GPUs
    assert rig.submit(**BIG).state == st.REJECTED
    waits = rig.submit(**WAITS).job_id  # no room: waits ...
    rig.advance(10)
    assert rig.cancel(waits) == st.CANCELLED  # ... until t=10
    rig.advance(10)
    surge = rig.submit(**SERVE).job_id  # t=20: preempts the training job (a notice)
    rig.advance(5)
    rig.ex.ack(train)  # t=25: it checkpointed; stopped, it exits and is requeued
    rig.cycle()
    rig.ex.exit(train, 1, (-15,))
    rig.cycle()
    assert rig.ex.calls[-1] == f"start {surge}/1"
    rig.advance(25)
    rig.ex.exit(surge, 1, (0,))  # t=50: the surge is over; the training job runs again
    rig.cycle()
    assert rig.ex.calls[-1] == f"start {train}/2"
    rig.advance(50)
    rig.ex.exit(serve, 1, (0,))  # t=100
    rig.cycle()
    rig.advance(150)
    rig.ex.exit(train, 2, (0,))  # t=250
    rig.cycle()
    rig.store.close()
    return seen


class _CancelAt:
    """The simulated user: cancels a job at a time."""

    def __init__(self, job_id: str, t: float) -> None:
        self.job_id, self.t = job_id, t

    def first_wake(self) -> float | None:
        return self.t

    def wake(self, now: float, sim: Simulation) -> tuple[list[Event], float | None]:
        ev = sim.cancel(self.job_id, now)
        return ([ev] if ev is not None else []), None


def _simulator(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """The same scenario in the simulator: the same jobs (the control plane's own specs, ids
    and submit times), durations that end each run when the control plane's test ended it;
    each job's states as ``JobTrace.move_to`` made them."""
    seen: dict[str, list[str]] = {}
    move = JobTrace.move_to

    def recorded(tr: JobTrace, new: S) -> None:
        move(tr, new)
        seen.setdefault(tr.item.job.id, [S.PENDING]).append(str(new))  # it starts pending

    monkeypatch.setattr(JobTrace, "move_to", recorded)
    tenant = core_tenant(ADMIN)

    def item(jid: str, fields: dict[str, Any], at: float, run_s: float, **kw: Any) -> WorkItem:
        job = SubmitRequest.model_validate(fields).to_job(jid, START_S + at, tenant)
        return WorkItem(job, run_s, **kw)

    work = [
        item("j1", SERVE, 0, 100.0),
        item("j2", TRAIN, 0, 200.0, ack_after_s=5.0),  # its 2nd attempt runs t=50..250
        item("j3", BIG, 0, 1.0),
        item("j4", WAITS, 0, 1.0),
        item("j5", SERVE, 20, 25.0),
    ]
    cluster = cluster_from_spec_dict(fenced())
    result = Simulation(cluster, work, controllers=[_CancelAt("j4", START_S + 10)]).run()
    for jid, tr in result.jobs.items():
        seen.setdefault(jid, [S.PENDING])
        assert seen[jid][-1] == tr.state
    return seen


def test_one_scenario_takes_every_job_through_the_same_states_in_both_front_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plane = _control_plane(tmp_path)
    sim = _simulator(monkeypatch)
    # ``starting`` is the control plane's own (bound and persisted, processes being spawned)
    plane = {jid: [s for s in states if s != S.STARTING] for jid, states in plane.items()}
    assert plane == sim
    assert sim == {
        "j1": ["pending", "running", "done"],
        "j2": ["pending", "running", "stopping", "pending", "running", "done"],
        "j3": ["pending", "rejected"],
        "j4": ["pending", "cancelled"],
        "j5": ["pending", "running", "done"],
    }
