"""The SQLite store: real files, migrations, transactions that land whole or not at all."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpufence.control import store as st


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
        tx.set_job("j1", state=st.DONE)
    with s.reader() as r:
        assert [j.id for j in r.jobs(tenant="a")] == ["j1", "j3"]
        assert [j.id for j in r.jobs(states=[st.DONE])] == ["j1"]
        assert [j.id for j in r.jobs(after_seq=3, limit=1)] == ["j3"]
    assert s.max_seq() == 5
    s.close()
