"""The SQLite store: real files, migrations, transactions that land whole or not at all."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpufence.control.store import database as st
from gpufence.control.store import migrations


def _add(tx: st.Tx, jid: str, tenant: str = "a") -> None:
    tx.add_job(
        job_id=jid,
        tenant=tenant,
        spec={"command": ["true"]},
        workload_class="training",
        partition="",
        queue="",
        submitted_at=1.0,
    )


def test_fresh_store_is_wal_and_at_current_schema(tmp_path: Path) -> None:
    s = st.Store(tmp_path)
    assert s.schema_version() == st.SCHEMA_VERSION
    mode = sqlite3.connect(tmp_path / st.DB_NAME).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    s.close()
    # reopening runs no migration twice
    s2 = st.Store(tmp_path)
    assert s2.schema_version() == st.SCHEMA_VERSION
    s2.close()


def test_newer_schema_is_refused_not_misread(tmp_path: Path) -> None:
    st.Store(tmp_path).close()
    conn = sqlite3.connect(tmp_path / st.DB_NAME)
    conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(99),))
    conn.commit()
    conn.close()
    with pytest.raises(st.StoreError, match="newer than this gpufence"):
        st.Store(tmp_path)


def test_failed_transaction_leaves_nothing(tmp_path: Path) -> None:
    s = st.Store(tmp_path)
    with pytest.raises(RuntimeError), s.transaction() as tx:
        _add(tx, "j1")
        raise RuntimeError("crash between two writes")
    with s.reader() as r:
        assert r.job("j1") is None
    with s.transaction() as tx:
        _add(tx, "j1")
        tx.set_job("j1", state=st.RUNNING)
        tx.add_attempt(
            job_id="j1",
            attempt=1,
            pool="p",
            lent_from=None,
            assignments=[{"node": 0, "gpus": [3]}],
            devices=[["3"]],
            started_at=2.0,
        )
        tx.log(2.0, "j1", "bind", "fits", "p -> n:3")
    with s.reader() as r:
        row = r.job("j1")
        assert row is not None and row.state == st.RUNNING
        att = r.attempt("j1", 1)
        assert att is not None and att.devices == [["3"]] and att.state == st.STARTING
        assert [e["kind"] for e in r.events(job_id="j1")] == ["bind"]
        assert r.counts() == {st.RUNNING: 1}
    s.close()


def test_filters(tmp_path: Path) -> None:
    s = st.Store(tmp_path)
    with s.transaction() as tx:
        for i in range(5):
            _add(tx, f"j{i}", tenant="a" if i % 2 else "b")
        tx.set_job("j1", state=st.RUNNING)  # a job runs before it is done (model/lifecycle.py)
        tx.set_job("j1", state=st.DONE)
    with s.reader() as r:
        assert [j.id for j in r.jobs(tenant="a")] == ["j1", "j3"]
        assert [j.id for j in r.jobs(states=[st.DONE])] == ["j1"]
        assert [j.id for j in r.jobs(after_seq=3, limit=1)] == ["j3"]
    assert s.max_seq() == 5
    s.close()


def test_fair_share_usage_round_trip(tmp_path: Path) -> None:
    s = st.Store(tmp_path)
    with s.reader() as r:
        assert r.usage() is None  # never saved
    with s.transaction() as tx:
        tx.save_usage({"a": 5.0, "b": 0.0}, 100.0)
    with s.transaction() as tx:  # a snapshot replaces the last one, queues that went included
        tx.save_usage({"a": 7.5}, 130.0)
    with s.reader() as r:
        assert r.usage() == ({"a": 7.5}, 130.0)
    s.close()


def test_version_1_store_is_migrated_keeping_its_jobs(tmp_path: Path) -> None:
    # a store written before the fair_share table existed
    conn = sqlite3.connect(tmp_path / st.DB_NAME)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    for stmt in migrations.MIGRATIONS[0].split(";"):
        if stmt.strip():
            conn.execute(stmt)
    conn.execute("INSERT INTO meta VALUES('schema_version', '1')")
    conn.execute(
        "INSERT INTO jobs(id, tenant, spec, workload_class, state, submitted_at)"
        " VALUES('old', 'a', '{}', 'training', 'pending', 1.0)"
    )
    conn.commit()
    conn.close()
    s = st.Store(tmp_path)
    assert s.schema_version() == st.SCHEMA_VERSION
    with s.reader() as r:
        old = r.job("old")
        assert old is not None and old.held is False  # migration 7: not on hold
        assert r.usage() is None
    s.close()
