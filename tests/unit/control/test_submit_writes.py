"""How a submit is written (``item_writes.write_submit``, ``job_writes.insert_job``), on the
reconciler rig (real SQLite store, fake executor):

* a new row carries the partition and queue the core will give the job (predicted with the
  core's own ``resolve``), so the decisions transaction rewrites no home it got right; one it
  got wrong is rewritten there, and a job the core rejects keeps the home its request named;
* the Idempotency-Key is claimed before the job is inserted: a request refused after the claim
  gives the key back (its savepoint), the same key twice in one batch is one job.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest

from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.gpus.discovery import fake_gpus, node_spec
from gpufence.control.reconciler import job_writes
from gpufence.control.reconciler.inbox import InvalidField, Submit, SubmitResult
from gpufence.control.store import database as st
from gpufence.sched.intake import Accepted
from gpufence.testing.reconciler_rig import ReconcilerRig


def _homes_written(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """Every (job, partition, queue) the decisions transactions rewrite from now on."""
    written: list[tuple[str, str, str]] = []
    set_homes = st.Tx.set_homes

    def spy(tx: st.Tx, homes: list[tuple[str, str, str]]) -> None:
        written.extend(homes)
        set_homes(tx, homes)

    monkeypatch.setattr(st.Tx, "set_homes", spy)
    return written


def test_a_new_row_has_the_home_the_core_resolves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = ReconcilerRig.make(tmp_path, node_spec(fake_gpus(4)))
    written = _homes_written(monkeypatch)
    blocker = rig.submit(command=["sleep"], gpus=4).job_id
    jid = rig.submit(command=["train"], gpus=1).job_id  # queued behind the blocker
    core = rig.rec.scheduler.job(jid)
    assert core.home and core.queue
    row = rig.job(jid)
    assert (row.partition, row.queue) == (core.home, core.queue)
    assert rig.job(blocker).partition == rig.rec.scheduler.job(blocker).home
    assert written == []  # predicted right: no row rewritten


def test_a_wrong_prediction_is_rewritten_and_a_rejected_job_keeps_what_it_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = ReconcilerRig.make(tmp_path, node_spec(fake_gpus(4)))
    written = _homes_written(monkeypatch)
    # a prediction the core then contradicts (in real life: the ledger changed in between)
    monkeypatch.setattr(job_writes, "resolve", lambda *_a: Accepted("elsewhere", "nowhere"))
    jid = rig.submit(command=["train"], gpus=1).job_id
    core = rig.rec.scheduler.job(jid)
    row = rig.job(jid)
    assert (row.partition, row.queue) == (core.home, core.queue) != ("elsewhere", "nowhere")
    too_big = rig.submit(command=["train"], gpus=8)  # no partition can ever hold it
    assert too_big.state == st.REJECTED
    row = rig.job(too_big.job_id)
    assert (row.partition, row.queue) == ("", "")
    assert [w[0] for w in written] == [jid, too_big.job_id]


def test_a_request_refused_after_its_key_was_claimed_gives_the_key_back(
    tmp_path: Path,
) -> None:
    rig = ReconcilerRig.make(tmp_path, node_spec(fake_gpus(4)))
    first = rig.submit(command=["sleep"], gpus=1, name="train").job_id
    fut = rig.rec.submit(SubmitRequest(command=["true"], gpus=1, name="train"), "admin", "k1")
    rig.cycle()
    with pytest.raises(InvalidField, match="is the name of"):
        fut.result(0)  # the name is taken: refused after the key was claimed
    again = rig.rec.submit(SubmitRequest(command=["true"], gpus=1, name="eval"), "admin", "k1")
    rig.cycle()
    res = again.result(0)  # the key is free: a new job, not "used for a different request"
    assert not res.replayed and res.job_id != first
    assert rig.job(res.job_id).name == "eval"


def test_the_same_key_twice_in_one_batch_is_one_job(tmp_path: Path) -> None:
    rig = ReconcilerRig.make(tmp_path, node_spec(fake_gpus(4)))
    req = SubmitRequest(command=["true"], gpus=1)
    futs: list[Future[SubmitResult]] = [Future(), Future()]
    rig.rec.cycle([Submit(req, "admin", f, "same-key") for f in futs])
    a, b = (f.result(0) for f in futs)
    assert a.job_id == b.job_id and not a.replayed and b.replayed
    with rig.store.reader() as r:
        assert [j.id for j in r.jobs()] == [a.job_id]
