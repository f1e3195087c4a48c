"""Issue 11, case 2: a full, read-only or failing data disk loses no exit and runs nothing twice.

Real mechanisms only: the data directory lives on a small tmpfs that is filled to ENOSPC or
remounted read-only, or on an ext4 whose loop device fails underneath (real I/O errors). While
the store refuses writes the API answers 503 ``store unavailable: <reason>``, exits are held in
memory and persisted once the store is back; launchers keep their exit records (in the space
reserved at spawn, else in the spool) so a restart after the fault settles every attempt from
them instead of running it again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_helpers import ADMIN as ADMIN_TOKEN
from api_helpers import Server, call, run_server, submit
from disks import FailingDisk, SmallDisk, require_root, small_disk

from gpufence.control.base.config import ADMIN, cluster_from_spec_dict, control_config
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.gpus.discovery import fake_gpus, node_spec
from gpufence.control.http.client import Client
from gpufence.control.plane import ControlPlane
from gpufence.control.store import database as st
from gpufence.demo import joblogs
from gpufence.testing.waiting import until

SPOOL_ENV = "GPUFENCE_EXIT_SPOOL"  # = member_records.SPOOL_ENV
# no output at the end: a job printing to a full disk would fail on its own
SHORT = {"command": ["sleep", "1.5"], "gpus": 1}
LONG = {"command": ["sleep", "60"], "gpus": 1}


@pytest.fixture
def spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Spooled exit records go to the test's own directory (on another file system)."""
    path = tmp_path / "spool"
    monkeypatch.setenv(SPOOL_ENV, str(path))
    return path


@pytest.fixture
def disk(tmp_path: Path, spool: Path) -> Iterator[SmallDisk]:
    require_root()
    with small_disk(tmp_path / "disk") as d:
        yield d


@pytest.fixture
def srv(disk: SmallDisk) -> Iterator[Server]:
    yield from run_server(disk.path)


def state(server: Server, jid: str) -> str:
    status, job, _ = call(server, "GET", f"/v1/jobs/{jid}")
    assert status == 200, job
    return str(job["state"])


def exit_code(data: Path, jid: str) -> int | None:
    try:
        code = json.loads((data / "jobs" / jid / "attempt-1.records" / "rank-0.exit").read_text())[
            "code"
        ]
    except (OSError, ValueError):
        return None
    return code if isinstance(code, int) else None


def spooled(spool: Path) -> int:
    return len(list(spool.glob("*.exit"))) if spool.exists() else 0


def _fault_while_jobs_end(srv: Server, disk: SmallDisk, spool: Path) -> None:
    short = [submit(srv, SHORT)[1]["id"] for _ in range(3)]
    status, long = submit(srv, LONG)
    assert status == 201, long
    until(lambda: all(state(srv, j) == "running" for j in [*short, long["id"]]), 20, "running")
    disk.fill()
    try:
        # the short jobs end while the store refuses writes: their launchers still record it,
        # in place, into the blocks reserved at spawn
        until(lambda: all(exit_code(srv.data, j) == 0 for j in short), 20, "exit records")
        status, out = submit(srv, {"command": ["true"]})
        assert status == 503 and out["detail"] == "store unavailable: disk full", out
        assert out["type"] == "urn:gpufence:problem:store-unavailable"
        status, out, _ = call(srv, "POST", f"/v1/jobs/{long['id']}/cancel")
        assert status == 503, out
        assert call(srv, "GET", "/healthz", token=None)[1]["store"] != "ok"
        status, out, _ = call(srv, "GET", "/readyz", token=None)  # alive, but not ready
        assert status == 503 and out["detail"] == "store unavailable: disk full", out
        until(lambda: srv.plane.reconciler.held >= 3, 10, "the 3 exits held in memory")
        assert all(state(srv, j) == "running" for j in short)  # not persisted yet
    finally:
        disk.free()
    # the store is back: what was held is persisted, GPUs are freed, the API works again
    until(lambda: all(state(srv, j) == "done" for j in short), 15, "held exits persisted")
    assert call(srv, "GET", "/healthz", token=None)[1]["store"] == "ok"
    assert call(srv, "GET", "/readyz", token=None)[0] == 200
    status, out, _ = call(srv, "POST", f"/v1/jobs/{long['id']}/cancel")
    assert status == 200, out
    until(lambda: state(srv, long["id"]) == "cancelled", 15, "cancelled")
    status, nxt = submit(srv, {"command": ["true"], "gpus": 4})
    assert status == 201, nxt
    until(lambda: state(srv, nxt["id"]) == "done", 15, "a job on the freed GPUs")
    for j in short:
        att = call(srv, "GET", f"/v1/jobs/{j}")[1]["attempts"]
        assert len(att) == 1 and att[0]["exit_codes"] == [0], att
    assert spooled(spool) == 0, "spooled records are dropped once persisted"
    runs = joblogs.process_runs(srv.data, node="local-0")
    assert joblogs.max_per_device(runs) == 1


def test_a_full_disk_holds_exits_until_the_store_is_back(
    srv: Server, disk: SmallDisk, spool: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="gpufence.store"):
        _fault_while_jobs_end(srv, disk, spool)
    said = [r.getMessage() for r in caplog.records if r.name == "gpufence.store"]
    # the log says when the fault began and when it was over, once each
    assert said.count("store unavailable: disk full") == 1, said
    assert said.count("store takes writes again (it was store unavailable: disk full)") == 1, said


def test_the_cli_retries_a_submit_through_a_full_disk(srv: Server, disk: SmallDisk) -> None:
    disk.fill()
    threading.Timer(1.0, disk.free).start()
    c = Client(url=srv.url, token=ADMIN_TOKEN)
    out = c.submit({"command": ["true"]})  # 503, 503, ... then 201 with the same key
    assert out["id"]
    jobs = [j for j in c.jobs() if j["spec"]["command"] == ["true"]]
    assert [j["id"] for j in jobs] == [out["id"]]


# ---------------------------------------------------------------------- restart after a fault
def _plane(data: Path) -> ControlPlane:
    cfg = control_config({"stop_grace_s": 2}, data.parent)
    return ControlPlane(cluster_from_spec_dict(node_spec(fake_gpus(4))), cfg, fake_gpus(4), data)


def _state(p: ControlPlane, jid: str) -> str:
    row = p.job(jid, ADMIN)
    assert row is not None
    return row.state


def _run_through_fault(data: Path, break_it: Any, repair: Any) -> str:
    p = _plane(data)
    p.start()
    try:
        jid = p.submit(SubmitRequest(command=["sleep", "1"], gpus=1), ADMIN).job_id
        until(lambda: _state(p, jid) == "running", 20, "running")
        break_it()
        until(lambda: p.reconciler.held > 0, 20, "the exit held in memory")
    finally:
        p.close()  # stops with the exit not persisted (logged)
    repair()
    p2 = _plane(data)
    p2.start()
    try:
        until(lambda: _state(p2, jid) != "running", 20, "settled")
        row = p2.job(jid, ADMIN)
        assert row is not None and row.state == st.DONE and row.attempt == 1, row
        time.sleep(0.5)
        assert not (data / "jobs" / jid / "attempt-2").exists(), "ran again"
    finally:
        p2.close(kill_jobs=True)
    return jid


def test_a_restart_after_a_full_disk_settles_from_the_reserved_records(
    disk: SmallDisk, spool: Path
) -> None:
    _run_through_fault(disk.path / "data", disk.fill, disk.free)


def test_a_read_only_store_is_a_clear_error_at_start(disk: SmallDisk) -> None:
    data = disk.path / "data"
    _plane(data).close()
    disk.read_only(True)
    try:
        with pytest.raises(st.StoreUnavailable, match="read-only"):
            _plane(data)
        with pytest.raises(st.StoreUnavailable, match="read-only"):
            _plane(disk.path / "fresh")
    finally:
        disk.read_only(False)


def test_real_io_errors_answer_503_and_a_repaired_disk_settles_everything(
    tmp_path: Path, spool: Path
) -> None:
    """ext4 fails under the store (I/O errors, then read-only): 503 with the reason; after
    the disk is repaired (fsck) a restart settles the attempt from its kept exit record
    (in place or spooled), whatever of the store's last writes the failure took."""
    require_root()
    failing = FailingDisk(tmp_path / "io")
    try:
        data = failing.path / "data"
        p = _plane(data)
        p.start()
        try:
            jid = p.submit(SubmitRequest(command=["sleep", "1"], gpus=1), ADMIN).job_id
            until(lambda: _state(p, jid) == "running", 20, "running")
            failing.break_it()
            # a durable write (a submit's fsync) meets the failing device: 503 with why
            reasons: list[str] = []

            def refused() -> bool:
                try:
                    p.submit(SubmitRequest(command=["true"]), ADMIN)
                except st.StoreUnavailable as exc:
                    reasons.append(exc.reason)
                    return True
                return False

            until(refused, 30, "a submit refused")
            assert reasons[0] in ("I/O error", "read-only"), reasons
            time.sleep(2.0)  # the job ends meanwhile; its launcher keeps its exit record
        finally:
            p.close()
        failing.repair()
        p2 = _plane(data)
        p2.start()
        try:
            until(lambda: _state(p2, jid) == st.DONE, 20, "done")
            time.sleep(0.5)
            assert not (data / "jobs" / jid / "attempt-2").exists(), "ran again"
            assert spooled(spool) == 0, "a spooled record outlived its persisting"
        finally:
            p2.close(kill_jobs=True)
    finally:
        failing.close()
