"""Accounting in the store (``store/accounting.py``): totals kept at attempt start and end, the
history and usage reads, and migration 6 upgrading a real store written by schema version 5."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpufence.control.store import accounting
from gpufence.control.store import database as st

FIXTURE = Path(__file__).parents[2] / "fixtures" / "store_v5.db"
WHOLE2 = [{"node": 0, "gpus": [0, 1], "milli": 1000}]


def _by_id(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in rows}


# (job, state, exit, attempts, preemptions, first start, elapsed s, GPUs, GPU-hours)
V5_EXPECTED = [
    ("j1", "done", 0, 2, 1, 1010.0, 400.0, 2.0, 800 / 3600),
    ("j2", "failed", 3, 1, 0, 2030.0, 600.0, 0.5, 300 / 3600),
    ("j3", "done", 0, 1, 0, 3100.0, 700.0, 0.429, 700 * 0.429 / 3600),  # MIG 3g = 3/7
    ("j4", "cancelled", None, 0, 0, None, 0.0, None, 0.0),
]


def test_a_version_5_store_is_upgraded_with_its_history_filled(tmp_path: Path) -> None:
    shutil.copy(FIXTURE, tmp_path / st.DB_NAME)
    s = st.Store(tmp_path)
    assert s.schema_version() == st.SCHEMA_VERSION  # 6: accounting, 7: names, 8: pending, ...
    with s.reader() as r:
        rows = _by_id(r.history(now=10_000.0))
        assert all(not row.held for row in r.jobs(states=()))  # none is on hold
        names = r._c.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE tenant = 'a' AND name = 'x'"
        ).fetchall()
        assert "jobs_tenant_name" in " ".join(str(tuple(p)) for p in names)
        plan = r._c.execute(  # the index the migration added is used
            "EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE ended_at >= 5 ORDER BY ended_at"
        ).fetchall()
    s.close()
    assert "jobs_ended" in " ".join(str(tuple(p)) for p in plan)
    assert set(rows) == {"j1", "j2", "j3", "j4"}
    for jid, state, code, attempts, preempted, first, elapsed, gpus, hours in V5_EXPECTED:
        row = rows[jid]
        assert (row["state"], row["exit_code"], row["attempts"]) == (state, code, attempts), jid
        assert (row["preemptions"], row["started_at"], row["gpus"]) == (preempted, first, gpus)
        assert row["elapsed_s"] == pytest.approx(elapsed), jid
        assert row["gpu_hours"] == pytest.approx(hours), jid
    assert rows["j1"]["queue_delay_s"] == pytest.approx(10.0)
    assert rows["j4"]["queue_delay_s"] is None


def test_an_upgraded_store_still_takes_jobs_and_reopens(tmp_path: Path) -> None:
    shutil.copy(FIXTURE, tmp_path / st.DB_NAME)
    st.Store(tmp_path).close()
    s = st.Store(tmp_path)  # reopening runs no migration twice
    with s.transaction() as tx:
        jid = tx.add_job(
            tenant="a", spec={}, workload_class="batch", partition="p", queue="q", submitted_at=1.0
        )
    s.close()
    assert jid == "j5"


def _job_with_attempts(
    s: st.Store, spans: list[tuple[float, float | None, str | None]], state: str = ""
) -> str:
    """A job of tenant a on 2 whole GPUs whose attempts ran over ``spans`` (start, end, stop),
    ``state`` now (default: running if its last attempt has not ended, else done)."""
    with s.transaction() as tx:
        jid = tx.add_job(
            tenant="a",
            spec={},
            workload_class="training",
            partition="train",
            queue="a",
            submitted_at=100.0,
        )
        for n, (start, end, stop) in enumerate(spans, 1):
            tx.add_attempt(
                job_id=jid,
                attempt=n,
                pool="train",
                lent_from=None,
                assignments=WHOLE2,
                devices=[["0", "1"]],
                started_at=start,
                gpus=2.0,
            )
            if stop is not None:
                tx.set_attempt(jid, n, stop_reason=stop, requeue=True)
            if end is not None:
                tx.set_attempt(jid, n, state="exited", ended_at=end, exit_codes=[0])
        tx.set_job(jid, state=st.RUNNING)  # through running, as the lifecycle goes
        state = state or (st.RUNNING if spans[-1][1] is None else st.DONE)
        tx.set_job(jid, state=state, ended_at=spans[-1][1], started_at=spans[-1][0])
    return jid


def test_totals_follow_every_attempt_and_a_running_job_counts_so_far(tmp_path: Path) -> None:
    s = st.Store(tmp_path)
    done = _job_with_attempts(s, [(110.0, 150.0, "incident-preemption"), (200.0, 260.0, None)])
    running = _job_with_attempts(s, [(300.0, None, None)])
    with s.reader() as r:
        rows = _by_id(r.history(now=400.0))
    s.close()
    for jid in (done, running):
        assert rows[jid]["elapsed_s"] == pytest.approx(100.0)
        assert rows[jid]["gpu_hours"] == pytest.approx(200.0 / 3600)
    assert (rows[done]["attempts"], rows[done]["preemptions"]) == (2, 1)


def test_writing_the_same_attempt_end_twice_counts_it_once(tmp_path: Path) -> None:
    s = st.Store(tmp_path)
    jid = _job_with_attempts(s, [(110.0, 150.0, None)])
    with s.transaction() as tx:  # a transaction written again after the store refused it
        tx.set_attempt(jid, 1, state="exited", ended_at=150.0, exit_codes=[0])
    with s.reader() as r:
        (row,) = r.history(now=400.0)
    s.close()
    assert row["elapsed_s"] == pytest.approx(40.0)


# window, expected GPU-seconds of the job that ran 110-150 and 200-260 on 2 GPUs
WINDOWS = [
    ((0.0, 1000.0), 200.0),
    ((120.0, 1000.0), 2 * (30 + 60)),
    ((120.0, 210.0), 2 * (30 + 10)),
    ((150.0, 200.0), 0.0),
    ((300.0, 1000.0), 0.0),
]


@pytest.mark.parametrize(("window", "gpu_s"), WINDOWS)
def test_usage_clips_attempts_to_the_window(
    tmp_path: Path, window: tuple[float, float], gpu_s: float
) -> None:
    s = st.Store(tmp_path)
    _job_with_attempts(s, [(110.0, 150.0, None), (200.0, 260.0, None)])
    since, until = window
    with s.reader() as r:
        groups, total = r.accounting_usage(by="tenant", now=1000.0, since=since, until=until)
    s.close()
    assert total["gpu_hours"] == pytest.approx(gpu_s / 3600)
    if gpu_s:
        assert [(g["key"], g["jobs"]) for g in groups] == [("a", 1)]
    first_bind_in_window = since <= 110.0 < until
    assert total["queue_delay_p50_s"] == (10.0 if first_bind_in_window else None)


# a job requeued once (110-150, pending since) and one running since 300, at now = 1000
OPEN_WINDOWS = [
    ((0.0, 2000.0), 2 * 40 + 2 * 700),
    ((500.0, 2000.0), 2 * 500),
    ((120.0, 400.0), 2 * 30 + 2 * 100),
]


@pytest.mark.parametrize(("window", "gpu_s"), OPEN_WINDOWS)
def test_usage_counts_open_jobs_up_to_now(
    tmp_path: Path, window: tuple[float, float], gpu_s: float
) -> None:
    s = st.Store(tmp_path)
    requeued = _job_with_attempts(s, [(110.0, 150.0, "lent-reclaim")], state=st.STOPPING)
    _job_with_attempts(s, [(300.0, None, None)])
    with s.transaction() as tx:
        tx.set_job(requeued, state=st.PENDING, ended_at=None, attempt=2)
    with s.reader() as r:
        groups, total = r.accounting_usage(by="class", now=1000.0, since=window[0], until=window[1])
        (pending,) = [j for j in r.history(now=1000.0) if j["id"] == requeued]
    s.close()
    assert total["gpu_hours"] == pytest.approx(gpu_s / 3600)
    assert [g["key"] for g in groups] == ["training"]
    assert (pending["preemptions"], pending["elapsed_s"]) == (1, pytest.approx(40.0))


def test_an_ended_jobs_kept_row_is_the_row_computed_for_it(tmp_path: Path) -> None:
    """The trigger's JSON (ended jobs) and the read-time JSON (open jobs) have one shape."""
    s = st.Store(tmp_path)
    jid = _job_with_attempts(s, [(110.0, 150.0, "incident-preemption"), (200.0, 260.0, None)])
    with s.transaction() as tx:
        tx.set_job(jid, exit_code=0)
    with s.reader() as r:
        kept, made = r._c.execute(
            f"SELECT history, {accounting._HISTORY_JSON} FROM jobs WHERE id = :id",
            {"id": jid, "now": 1000.0},
        ).fetchone()
    s.close()
    assert kept is not None and json.loads(kept) == json.loads(made)
    assert json.loads(kept)["gpu_hours"] == pytest.approx(200 / 3600)
