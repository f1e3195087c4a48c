"""Array references in the store (issue 32, item 9): an array's own id, ``jA_3``, and arrays
an older version stored, which were named by their first task's id (a data dir of before
keeps meaning what it meant: that id is still the one task, ``jA_3`` finds its tasks)."""

from __future__ import annotations

from pathlib import Path

from gpufence.control.store import database as st


def _task(tx: st.Tx, array: str, index: int, spec: str = "0-2") -> str:
    return tx.add_job(
        tenant="a",
        spec={"command": ["true"], "array": spec, "array_task": {"job": array, "index": index}},
        workload_class="training",
        partition="",
        queue="",
        submitted_at=1.0,
    )


def test_an_array_id_and_its_tasks(tmp_path: Path) -> None:
    s = st.Store(tmp_path)
    with s.transaction() as tx:
        array = tx.next_id(reserve=True)
        ids = [_task(tx, array, i) for i in range(3)]
    with s.transaction() as tx:
        assert (array, ids) == ("j1", ["j2", "j3", "j4"])
        assert [n.id for n in tx.resolve_ref("a", array)] == ids
        assert [n.index for n in tx.resolve_ref("a", array)] == [0, 1, 2]
        assert [n.id for n in tx.resolve_ref("a", "j1_2")] == ["j4"]
        assert tx.array_tasks(array) == tuple(ids)
        assert tx.next_id() == "j5"  # the array's id is never a job's
    s.close()


def test_an_array_stored_by_an_older_version(tmp_path: Path) -> None:
    s = st.Store(tmp_path)
    with s.transaction() as tx:  # as before: the array named by its first task's id
        ids = [_task(tx, "j1", i) for i in range(3)]
    with s.transaction() as tx:
        assert ids == ["j1", "j2", "j3"]
        assert [n.id for n in tx.resolve_ref("a", "j1")] == ["j1"]  # the task, as before
        assert [n.id for n in tx.resolve_ref("a", "j1_2")] == ["j3"]
        assert tx.array_tasks("j1") == tuple(ids)  # a replayed submit's answer, as before
        assert tx.array_tasks("j2") == ()
    s.close()
