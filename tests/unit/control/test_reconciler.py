"""The reconciler over a fake executor and a real SQLite store, one cycle at a time.

* persistence order: every decision is committed before the executor is asked to act on it
  (the hooks of the fake executor read the store, as an API thread would, during the call);
* exits reach the store (state, exit code, the attempt's record) and free the GPUs at once;
* the preemption handshake: notice -> ack -> stop -> exit -> requeue as the next attempt;
* cancel of a pending, a running and an ended job;
* recovery after a crash: adopted attempts are not started again, ended ones are settled, lost
  ones come back as their next attempt, a pending stop is sent again.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from gpufence.control.base.executor import Launch
from gpufence.control.gpus.discovery import fake_gpus, node_spec
from gpufence.control.reconciler.inbox import CancelError
from gpufence.control.store import database as st
from gpufence.testing.fake_executor import NoticeCall, StopCall
from gpufence.testing.reconciler_rig import ReconcilerRig

SERVE = {"command": ["serve"], "class": "serving"}


def shared(gpus: int) -> dict[str, Any]:
    """One node of ``gpus`` fake GPUs, one exclusive partition for every class."""
    return node_spec(fake_gpus(gpus))


def fenced() -> dict[str, Any]:
    """4 GPUs: a serving fence of one GPU that may preempt checkpointable training (grace 10 s,
    budget 2 an hour), training on the other three."""
    spec = copy.deepcopy(shared(4))
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


# ---------------------------------------------------------------------- persistence order
def test_a_bind_is_committed_before_the_executor_starts_it(tmp_path: Path) -> None:
    rig = ReconcilerRig.make(tmp_path, shared(4))
    seen: list[tuple[str, str | None, list[str]]] = []

    def at_start(launch: Launch) -> None:
        att = rig.attempt(launch.job_id, launch.attempt)
        row = rig.job(launch.job_id)
        seen.append((row.state, att.state if att else None, rig.event_kinds(launch.job_id)))

    rig.ex.on_start = at_start
    res = rig.submit(command=["train"], gpus=2)
    assert seen == [(st.STARTING, st.STARTING, ["submitted", "bind"])]
    (launch,) = rig.ex.launches
    assert [m.devices for m in launch.members] == [("0", "1")]
    assert launch.attempt_dir == tmp_path / "jobs" / res.job_id / "attempt-1"
    # the executor said it started: that is committed after the call
    assert res.state == st.RUNNING
    assert rig.job(res.job_id).state == st.RUNNING
    att = rig.attempt(res.job_id, 1)
    assert att is not None and att.state == st.RUNNING


def test_notice_and_stop_are_committed_before_they_are_sent(tmp_path: Path) -> None:
    rig = ReconcilerRig.make(tmp_path, fenced())
    rig.submit(**SERVE)
    train = rig.submit(command=["train"], gpus=3, checkpointable=True).job_id
    at_notice: list[tuple[str, str, list[str]]] = []
    at_stop: list[tuple[str, str | None, bool | None, list[str]]] = []

    def notice(call: NoticeCall) -> None:
        row = rig.job(call.job_id)
        at_notice.append((row.state, row.message, rig.event_kinds(call.job_id)))

    def stop(call: StopCall) -> None:
        row, att = rig.job(call.job_id), rig.attempt(call.job_id, call.attempt)
        assert att is not None
        at_stop.append((row.state, att.stop_reason, att.requeue, rig.event_kinds(call.job_id)))

    rig.ex.on_notice, rig.ex.on_stop = notice, stop
    surge = rig.submit(**SERVE)  # the serving fence is full: its 2nd replica needs the gang
    assert surge.state == st.PENDING and surge.reason == "waiting-for-preemption"
    assert [(n.job_id, n.reason, n.deadline_unix) for n in rig.ex.notices] == [
        (train, "incident-preemption", rig.now + 10)
    ]
    ((state, message, kinds),) = at_notice
    assert state == st.RUNNING and message.startswith("notice: ")
    assert kinds[-1] == "notice"

    rig.ex.ack(train)
    rig.cycle()
    assert at_stop == [
        (
            st.STOPPING,
            "incident-preemption",
            True,
            ["submitted", "bind", "notice", "checkpoint-ack", "stop"],
        )
    ]
    assert rig.ex.stops == [StopCall(train, 1, rig.config.stop_grace_s)]

    rig.ex.exit(train, 1, (-15,))  # it checkpointed and ended on SIGTERM
    rig.cycle()
    row = rig.job(train)
    assert (row.state, row.attempt, row.exit_code) == (st.PENDING, 2, -15)
    assert rig.event_kinds(train)[-2:] == ["exited", "requeue"]
    assert rig.ex.calls[-1] == f"start {surge.job_id}/1"  # its GPUs went to the surge at once


def test_an_attempt_that_finished_before_its_stop_is_done_not_run_again(tmp_path: Path) -> None:
    """A checkpointable job acks its notice at its last step and exits 0: its exit was seen
    before the stop was asked of it, and is read after the scheduler decided that stop. The
    attempt finished its work: the job is done, not requeued to run again (found by
    bench/crash_points.py: 'j14 completed 2x (attempts [2, 3])')."""
    rig = ReconcilerRig.make(tmp_path, fenced())
    rig.submit(**SERVE)
    train = rig.submit(command=["train"], gpus=3, checkpointable=True).job_id
    surge = rig.submit(**SERVE)
    rig.ex.ack(train)
    rig.cycle()
    assert rig.ex.stops == [StopCall(train, 1, rig.config.stop_grace_s)]
    rig.ex.exit(train, 1, (0,), before_stop=True)
    rig.cycle()
    row = rig.job(train)
    assert (row.state, row.attempt, row.exit_code) == (st.DONE, 1, 0)
    assert "requeue" not in rig.event_kinds(train)
    assert rig.preemptions(train) == 0  # the stop ended none of it: not counted
    assert not rig.ex.is_running(train, 2)
    assert rig.job(surge.job_id).state == st.RUNNING  # the GPUs it gave back went to the surge


def test_an_attempt_that_exits_0_on_its_stop_is_requeued(tmp_path: Path) -> None:
    """Exit 0 after the stop was asked of it (a graceful exit on SIGTERM) is no proof the work
    is done: the job is requeued, as one killed by the signal is."""
    rig = ReconcilerRig.make(tmp_path, fenced())
    rig.submit(**SERVE)
    train = rig.submit(command=["train"], gpus=3, checkpointable=True).job_id
    rig.submit(**SERVE)
    rig.ex.ack(train)
    rig.cycle()
    rig.ex.exit(train, 1, (0,))
    rig.cycle()
    row = rig.job(train)
    assert (row.state, row.attempt) == (st.PENDING, 2)
    assert rig.event_kinds(train)[-2:] == ["exited", "requeue"]


def _stopping_for_a_surge(rig: ReconcilerRig) -> tuple[str, str]:
    """A serving job, a checkpointable training job on the rest, and a serving surge: the
    training job acks its notice and is being stopped for requeue. (serving id, training id)"""
    serve = rig.submit(**SERVE).job_id
    train = rig.submit(command=["train"], gpus=3, checkpointable=True).job_id
    rig.submit(**SERVE)
    rig.ex.ack(train)
    rig.cycle()
    assert rig.ex.stops == [StopCall(train, 1, rig.config.stop_grace_s)]
    assert rig.job(train).state == st.STOPPING
    return serve, train


@pytest.mark.parametrize(
    ("before_stop", "stop_reached", "state", "attempt"),
    [
        (False, False, st.DONE, 1),
        (False, True, st.PENDING, 2),
        (False, None, st.PENDING, 2),
        (True, True, st.PENDING, 2),
        (True, None, st.DONE, 1),
    ],
)
def test_an_exit_0_while_stopping_is_done_only_if_the_stop_reached_no_member(
    tmp_path: Path, before_stop: bool, stop_reached: bool | None, state: str, attempt: int
) -> None:
    """The command exited 0 before the stop's signal reached it (the launchers record it:
    ``stop_reached`` False): the work is done, the job is not run again, even though the stop
    was asked of the executor. A stop that reached it (True) is a graceful exit on SIGTERM:
    requeued, also where this executor had not asked it yet (a stop sent before a restart).
    With no such record (None: an older launcher, a member lost with its node) whether the
    executor had asked decides, as before."""
    rig = ReconcilerRig.make(tmp_path, fenced())
    _, train = _stopping_for_a_surge(rig)
    rig.ex.exit(train, 1, (0,), before_stop=before_stop, stop_reached=stop_reached)
    rig.cycle()
    row = rig.job(train)
    assert (row.state, row.attempt) == (state, attempt)
    assert ("requeue" in rig.event_kinds(train)) == (state == st.PENDING)
    assert rig.preemptions(train) == (0 if state == st.DONE else 1)


def test_a_notice_without_ack_becomes_a_stop_at_its_deadline(tmp_path: Path) -> None:
    rig = ReconcilerRig.make(tmp_path, fenced())
    rig.submit(**SERVE)
    train = rig.submit(command=["train"], gpus=3, checkpointable=True).job_id
    rig.submit(**SERVE)
    assert rig.ex.calls[-1] == f"notice {train}/1"
    rig.advance(9.0)
    rig.cycle()
    assert rig.ex.stops == []
    rig.advance(1.0)
    rig.cycle()  # nothing in the inbox: the deadline alone wakes the cycle
    assert rig.ex.stops == [StopCall(train, 1, rig.config.stop_grace_s)]
    assert rig.job(train).state == st.STOPPING


def test_a_job_killed_during_its_notice_is_requeued_in_the_store_as_in_the_core(
    tmp_path: Path,
) -> None:
    """A checkpointable job that goes down during an incident notice (killed by the notice
    signal, -10) is a stop the core did itself: it requeues it (Stop, Requeue). The store
    follows those decisions: running -> stopping -> pending, never 'failed' first (which the
    lifecycle then refused to move, leaving the store and the core apart)."""
    rig = ReconcilerRig.make(tmp_path, fenced())
    rig.submit(**SERVE)
    train = rig.submit(command=["train"], gpus=3, checkpointable=True).job_id
    rig.submit(**SERVE)
    assert rig.ex.calls[-1] == f"notice {train}/1"
    rig.ex.exit(train, 1, (-10,))
    rig.cycle()
    row = rig.job(train)
    assert (row.state, row.attempt) == (st.PENDING, 2)
    assert "not-applied" not in rig.event_kinds(train)


# ---------------------------------------------------------------------- exits
@pytest.mark.parametrize(
    ("codes", "state", "exit_code", "reason"),
    [
        ((0,), st.DONE, 0, ""),
        ((3,), st.FAILED, 3, "exit-code"),
        ((0, -9), st.FAILED, -9, "exit-code"),
    ],
    ids=["ok", "code-3", "gang-member-killed"],
)
def test_an_exit_reaches_the_store_and_frees_the_gpus(
    tmp_path: Path, codes: tuple[int | None, ...], state: str, exit_code: int | None, reason: str
) -> None:
    rig = ReconcilerRig.make(tmp_path, shared(4))
    first = rig.submit(command=["train"], gpus=2, replicas=len(codes)).job_id
    waiting = rig.submit(command=["train"], gpus=4).job_id
    assert rig.job(waiting).state == st.PENDING
    rig.advance(30.0)
    rig.ex.exit(first, 1, codes)
    rig.cycle()
    row = rig.job(first)
    assert (row.state, row.exit_code, row.reason, row.ended_at) == (
        state,
        exit_code,
        reason,
        rig.now,
    )
    att = rig.attempt(first, 1)
    assert att is not None
    assert (att.state, att.exit_codes, att.ended_at) == ("exited", list(codes), rig.now)
    assert rig.ex.calls[-1] == f"start {waiting}/1"  # in the same cycle
    assert rig.job(waiting).state == st.RUNNING


@pytest.mark.parametrize(
    ("max_attempts", "state", "attempt"), [(2, st.RUNNING, 2), (1, st.FAILED, 1)]
)
def test_a_member_lost_while_running_requeues_the_attempt_while_attempts_remain(
    tmp_path: Path, max_attempts: int, state: str, attempt: int
) -> None:
    """A member whose launcher died without recording the job's exit (code None): the job's
    outcome is unknown, so it is requeued as the next attempt (started at once: its GPUs are
    free) while max_attempts allows, else failed as lost -- as when it happens while the
    control plane is down."""
    rig = ReconcilerRig.make(tmp_path, shared(4))
    jid = rig.submit(command=["train"], gpus=2, replicas=2, max_attempts=max_attempts).job_id
    rig.advance(30.0)
    rig.ex.exit(jid, 1, (0, None))
    rig.cycle()
    row = rig.job(jid)
    assert (row.state, row.attempt) == (state, attempt), row
    assert "lost" in rig.event_kinds(jid) or row.reason == "lost", rig.event_kinds(jid)
    if state == st.FAILED:
        assert row.reason == "lost" and "max_attempts" in row.message
    else:
        assert rig.ex.calls[-1] == f"start {jid}/2"


def test_a_stale_exit_changes_nothing(tmp_path: Path) -> None:
    rig = ReconcilerRig.make(tmp_path, shared(2))
    jid = rig.submit(command=["train"]).job_id
    rig.ex.exit(jid, 1, (0,))
    rig.cycle()
    before, events = rig.job(jid), rig.event_kinds(jid)
    rig.ex.exit(jid, 1, (1,), strict=False)  # a second report of the same attempt
    rig.cycle()
    assert (rig.job(jid), rig.event_kinds(jid)) == (before, events)


# ---------------------------------------------------------------------- cancel
def test_cancel_a_pending_job_removes_it_without_the_executor(tmp_path: Path) -> None:
    rig = ReconcilerRig.make(tmp_path, shared(2))
    first = rig.submit(command=["train"], gpus=2).job_id
    waiting = rig.submit(command=["train"], gpus=2).job_id
    calls = list(rig.ex.calls)
    assert rig.cancel(waiting) == st.CANCELLED
    row = rig.job(waiting)
    assert (row.state, row.cancel_requested, row.ended_at) == (st.CANCELLED, True, rig.now)
    assert rig.ex.calls == calls
    rig.ex.exit(first, 1, (0,))
    rig.cycle()
    assert f"start {waiting}/1" not in rig.ex.calls  # it left the queue too


def test_cancel_a_running_job_stops_it_once_and_ends_it_cancelled(tmp_path: Path) -> None:
    rig = ReconcilerRig.make(tmp_path, shared(2))
    jid = rig.submit(command=["train"], gpus=2).job_id
    at_stop: list[tuple[str, bool]] = []
    rig.ex.on_stop = lambda call: at_stop.append(
        (rig.job(call.job_id).state, rig.job(call.job_id).cancel_requested)
    )
    assert rig.cancel(jid) == st.STOPPING
    assert at_stop == [(st.STOPPING, True)]
    assert rig.cancel(jid) == st.STOPPING  # asked again: no second stop
    assert rig.ex.stops == [StopCall(jid, 1, rig.config.stop_grace_s)]
    rig.ex.exit(jid, 1, (-15,))
    rig.cycle()
    row = rig.job(jid)
    assert (row.state, row.exit_code) == (st.CANCELLED, -15)
    with pytest.raises(CancelError, match="already ended"):
        rig.cancel(jid)


# ---------------------------------------------------------------------- recovery
def test_recovery_adopts_what_runs_settles_what_ended_and_requeues_what_was_lost(
    tmp_path: Path,
) -> None:
    spec = shared(4)
    rig = ReconcilerRig.make(tmp_path, spec)
    alive, ended, stopping, lost = (rig.submit(command=["t"]).job_id for _ in range(4))
    waiting = rig.submit(command=["t"], gpus=2).job_id
    assert rig.cancel(stopping) == st.STOPPING
    assert rig.job(waiting).state == st.PENDING

    # kill -9 of the control plane; the processes of `alive` and `stopping` survive it
    new, counts = rig.restart(spec, adopt={(alive, 1): True, (ended, 1): (0,), (stopping, 1): True})
    assert counts == {"pending": 1, "adopted": 2, "ended-while-down": 2, "invalid": 0}
    assert new.ex.calls == [
        f"adopt {alive}/1",
        f"adopt {ended}/1",
        f"exit {ended}/1",
        f"adopt {stopping}/1",
        f"adopt {lost}/1",
        f"exit {lost}/1",
    ]
    new.cycle()  # recovery's findings, then the exits of the two gone attempts
    assert new.job(alive).state == st.RUNNING
    assert (new.job(ended).state, new.job(ended).exit_code) == (st.DONE, 0)
    assert new.ex.stops == [StopCall(stopping, 1, new.config.stop_grace_s)]  # sent again
    row = new.job(lost)
    assert (row.state, row.attempt) == (st.PENDING, 2)  # requeued behind the waiting job
    assert "requeued" in new.event_kinds(lost)
    # the two GPUs that the gone attempts held went to the job that waited for them; nothing
    # that still runs was started again
    assert [c for c in new.ex.calls if c.startswith("start ")] == [f"start {waiting}/1"]

    # the adopted attempts are the scheduler's again: their exits settle them as usual
    new.ex.exit(alive, 1, (0,))
    new.ex.exit(stopping, 1, (-15,))
    new.cycle()
    assert new.job(alive).state == st.DONE
    assert new.job(stopping).state == st.CANCELLED
    assert new.ex.calls[-1] == f"start {lost}/2"  # the lost attempt is replaced by the next one
    new.ex.exit(lost, 1, (0,), strict=False)  # a late report of the lost attempt: ignored
    new.cycle()
    assert (new.job(lost).state, new.job(lost).attempt) == (st.RUNNING, 2)


@pytest.mark.parametrize(
    ("stop_reached", "state", "attempt"),
    [(False, st.DONE, 1), (True, st.RUNNING, 2), (None, st.RUNNING, 2)],  # started at once
)
def test_an_attempt_stopped_for_requeue_that_ended_while_down_runs_again_only_if_stopped(
    tmp_path: Path, stop_reached: bool | None, state: str, attempt: int
) -> None:
    """A checkpointable job is being stopped for requeue when the control plane dies; its
    member exits 0 meanwhile. Recovery settles it from its launcher's record: a stop that
    reached no member (False) means it finished its work first: done, never run again; one
    that reached it (True), or no such record (None), is requeued as the next attempt (and,
    its GPUs free, started)."""
    spec = fenced()
    rig = ReconcilerRig.make(tmp_path, spec)
    serve, train = _stopping_for_a_surge(rig)
    reached = {} if stop_reached is None else {(train, 1): stop_reached}
    adopt: dict[tuple[str, int], Any] = {(serve, 1): True, (train, 1): (0,)}
    new, counts = rig.restart(spec, adopt=adopt, stop_reached=reached)
    assert counts["ended-while-down"] == 1
    new.cycle()
    row = new.job(train)
    assert (row.state, row.attempt) == (state, attempt)  # requeued: started again at once
    assert (f"start {train}/2" in new.ex.calls) == (attempt == 2)
    assert new.preemptions(train) == (0 if state == st.DONE else 1)


# ---------------------------------------------------------------------- group commit
def test_a_batch_of_submits_with_one_that_raises_keeps_the_others_in_order(
    tmp_path: Path,
) -> None:
    """The inbox writes a batch of requests in one savepoint; one that raises undoes the batch,
    which is written again request by request: the others land, with consecutive ids (the
    sequence cached by the transaction follows the rollback), and the bad one alone is refused."""
    from concurrent.futures import Future

    from gpufence.control.base.jobspec import SubmitRequest
    from gpufence.control.reconciler.inbox import Submit, SubmitResult

    rig = ReconcilerRig.make(tmp_path, shared(4))
    good = SubmitRequest(command=["true"], gpus=1)
    # bypassed validation (a bug, an older store): OverflowError while it is written
    bad = SubmitRequest.model_construct(command=["true"], gpu_fraction=0.5, gpu_mem_gib=1e308)
    futs: list[Future[SubmitResult]] = [Future() for _ in range(3)]
    keys = ["k-a", "k-bad", "k-b"]
    reqs = [good, bad, good]
    rig.rec.cycle([Submit(r, "admin", f, k) for r, f, k in zip(reqs, futs, keys, strict=True)])
    assert [futs[0].result(0).job_id, futs[2].result(0).job_id] == ["j1", "j2"]
    with pytest.raises(OverflowError):
        futs[1].result(0)
    with rig.rec.store.reader() as r:
        assert [j.id for j in r.jobs()] == ["j1", "j2"]
        assert [e["job_id"] for e in r.events() if e["kind"] == "submitted"] == ["j1", "j2"]
    again: Future[SubmitResult] = Future()
    rig.rec.cycle([Submit(good, "admin", again, "k-b")])  # the key was kept with its job
    assert again.result(0).job_id == "j2" and again.result(0).replayed


def test_a_spec_that_cannot_be_stored_is_refused_in_the_cycle_alone(tmp_path: Path) -> None:
    """``Reconciler.submit`` makes the stored spec on the caller's thread; one that raises there
    does not raise to the caller: the cycle makes it again, refuses that request alone (the
    error is its answer) and stores the others."""
    from pydantic_core import PydanticSerializationError

    from gpufence.control.base.jobspec import SubmitRequest

    rig = ReconcilerRig.make(tmp_path, shared(4))
    good = SubmitRequest(command=["true"], gpus=1)
    bad = SubmitRequest.model_construct(command=["true"], gpus=1, env={"A": object()})
    futs = [rig.rec.submit(r, "admin") for r in (good, bad, good)]
    items = rig.rec._wait()
    assert len(items) == 3 and items[1].stored is None  # type: ignore[union-attr]
    rig.rec.cycle(items)
    assert [futs[0].result(0).job_id, futs[2].result(0).job_id] == ["j1", "j2"]
    with pytest.raises(PydanticSerializationError):
        futs[1].result(0)
    with rig.rec.store.reader() as r:
        assert [j.id for j in r.jobs()] == ["j1", "j2"]


def test_a_request_waits_for_the_ones_sent_right_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: after a batch of two, the reconciler's wait takes a submit and then the
    one that follows it (one fsync for both), and starts the cycle as soon as it is there, not
    at the end of the window; a lone submit after a batch of one waits for nothing; an
    observation alone does not wait."""
    import threading
    import time

    from gpufence.control.base.jobspec import SubmitRequest
    from gpufence.control.reconciler import loop as rmod
    from gpufence.control.reconciler.inbox import Ack, Submit

    monkeypatch.setattr(rmod, "GATHER_S", 30.0)  # generous: a loaded machine is slow to send
    rig = ReconcilerRig.make(tmp_path, shared(4))
    rec = rig.rec
    req = SubmitRequest(command=["true"], gpus=1)
    rec.gather.target = 2  # the last batch held two
    rec.submit(req, "admin")
    later = threading.Timer(0.1, lambda: rec.submit(req, "admin"))
    later.start()
    t0 = time.monotonic()
    items = rec._wait()
    later.join()
    assert [type(it) for it in items] == [Submit, Submit]
    assert time.monotonic() - t0 < 20.0  # woken by the second, not by the 30 s window
    assert rec.gather.target == 2
    rec.gather.target = 1
    rec.submit(req, "admin")
    t0 = time.monotonic()
    assert [type(it) for it in rec._wait()] == [Submit]
    assert time.monotonic() - t0 < 20.0
    rec._inbox.put(Ack("j1", 1))
    t0 = time.monotonic()
    assert [type(it) for it in rec._wait()] == [Ack]
    assert time.monotonic() - t0 < 20.0


def test_a_spent_preemption_budget_stays_spent_after_a_restart(tmp_path: Path) -> None:
    """Budget 1 an hour: one incident preemption spends it. A control plane that restarts
    (a crash loop) must not hand the fence a fresh budget: the next surge waits."""
    spec = fenced()
    spec["partitions"]["serving"]["preemption"]["budget"] = 1
    rig = ReconcilerRig.make(tmp_path, spec)
    serve = rig.submit(**SERVE).job_id
    train = rig.submit(command=["train"], gpus=3, checkpointable=True).job_id
    surge = rig.submit(**SERVE).job_id
    assert [n.job_id for n in rig.ex.notices] == [train]  # the one preemption the budget has
    rig.ex.ack(train)
    rig.cycle()
    rig.ex.exit(train, 1, (-15,))
    rig.cycle()
    assert rig.job(surge).state == st.STARTING or rig.job(surge).state == st.RUNNING
    rig.cancel(surge)
    rig.ex.exit(surge, 1, (-15,))
    rig.cycle()
    assert (rig.job(train).attempt, rig.job(train).state) in ((2, st.STARTING), (2, st.RUNNING))
    rig.advance(60)

    new, _ = rig.restart(spec, adopt={(serve, 1): True, (train, 2): True})
    new.cycle()
    again = new.submit(**SERVE)
    assert again.state == st.PENDING and again.reason == "preemption-budget", again
    assert new.ex.notices == []
    new.advance(3600)  # the window slides past the first preemption: the budget is back
    new.cycle()
    assert [n.job_id for n in new.ex.notices] == [train]


def test_a_cancel_that_comes_before_a_failed_binds_exit_moves_it_legally(tmp_path: Path) -> None:
    """A bind that cannot be carried out (its stored spec no longer valid, as an older
    version's could be) is stored 'starting' like any bind; a cancel that reaches it before the
    empty launch's exit is a legal starting -> stopping move (it was pending -> stopping, which
    the lifecycle refuses: the cancel failed); the job then ends failed, as its launch did
    before the cancel took effect (the exit is written in the cancel's own cycle)."""
    import sqlite3

    rig = ReconcilerRig.make(tmp_path, shared(1))
    first = rig.submit(command=["sleep", "100"], gpus=1)
    second = rig.submit(command=["true"], gpus=1)
    assert rig.job(second.job_id).state == st.PENDING
    with sqlite3.connect(rig.store.path) as c:  # a spec this version cannot run
        c.execute("UPDATE jobs SET spec=? WHERE id=?", ('{"command": 5}', second.job_id))
    rig.ex.exit(first.job_id)
    rig.cycle()  # first ends; second is bound, its launch cannot be made
    row = rig.job(second.job_id)
    assert (row.state, row.reason) == (st.STARTING, "invalid")
    assert rig.cancel(second.job_id) == st.STOPPING  # taken before the empty launch's exit
    row = rig.job(second.job_id)
    assert row.state == st.FAILED


def test_a_decision_against_the_stored_lifecycle_is_undone_alone(tmp_path: Path) -> None:
    """A Stop for a job the store already has ended (its exit won) would move it failed ->
    stopping, which the store refuses: that decision is undone in its own savepoint and logged,
    and the cycle's other decisions (here a bind) are persisted and carried out. Before, the
    refusal failed the whole cycle, and its binds were lost (seen under CI load: a serving
    surge never placed)."""
    import sqlite3

    rig = ReconcilerRig.make(tmp_path, shared(2))
    first = rig.submit(command=["sleep", "100"], gpus=1, time_limit_s=10)
    assert rig.job(first.job_id).state == st.RUNNING
    with sqlite3.connect(rig.store.path) as c:  # its exit persisted, the core not told yet
        c.execute("UPDATE jobs SET state='failed' WHERE id=?", (first.job_id,))
    rig.advance(11)  # past the time limit: the core stops it
    second = rig.submit(command=["true"], gpus=1)  # and binds this in the same cycle
    assert rig.job(second.job_id).state in (st.STARTING, st.RUNNING)
    assert rig.job(first.job_id).state == st.FAILED
    assert "not-applied" in rig.event_kinds(first.job_id)
