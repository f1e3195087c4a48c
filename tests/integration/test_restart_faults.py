"""Issue 11: restarts after the faults an operator or a hostile user causes (cases 1, 3, 4, 5,
7, 8), each checked from the store and the jobs' own logs. Real servers (``gpufence up`` as a
subprocess where it must be ``kill -9``-ed), real processes, real SQLite files.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from server_proc import JOB, alive, client, kill9, last_log, record, record_file, stop, up

from gpufence.control.base.config import ADMIN, cluster_from_spec_dict, control_config
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.gpus.discovery import fake_gpus, node_spec
from gpufence.control.http.client import ClientError
from gpufence.control.plane import ControlPlane
from gpufence.control.store import database as st
from gpufence.demo import joblogs
from gpufence.testing.crashrun import kill_leftovers
from gpufence.testing.waiting import until


def _plane(data: Path) -> ControlPlane:
    cfg = control_config({"stop_grace_s": 2}, data.parent)
    spec = node_spec(fake_gpus(8))
    return ControlPlane(cluster_from_spec_dict(spec), cfg, fake_gpus(8), data)


def _req(*args: str, **fields: Any) -> SubmitRequest:
    return SubmitRequest.model_validate({"command": [*JOB, *args], **fields})


def _state(p: ControlPlane, jid: str) -> str:
    row = p.job(jid, ADMIN)
    assert row is not None
    return row.state


def _attempt(p: ControlPlane, jid: str) -> int:
    row = p.job(jid, ADMIN)
    assert row is not None
    return row.attempt


def _ends(data: Path) -> dict[str, int]:
    """Per job, how many attempts printed an end line with code 0 (completed runs)."""
    out: dict[str, int] = {}
    for f in data.glob("jobs/*/attempt-*/rank-0.out"):
        for line in f.read_text().splitlines():
            ev = json.loads(line)
            if ev["ev"] == "end" and ev["code"] == 0:
                out[ev["job"]] = out.get(ev["job"], 0) + 1
    return out


# ---------------------------------------------------------------------- case 1
def test_poisoned_stored_jobs_cost_no_running_job_at_restart(tmp_path: Path) -> None:
    """An older version stored jobs the scheduler raised on (an infinite estimate, a lone
    surrogate). At the next start their events came first and the rest were lost: a running
    8-GPU job was not restored and a new job ran on GPU 0 beside it."""
    data = tmp_path / "data"
    _plane(data).close()

    def insert(conn: sqlite3.Connection, seq: int, spec: str, state: str) -> str:
        conn.execute(
            "INSERT INTO jobs(seq, id, tenant, spec, workload_class, state, submitted_at)"
            " VALUES(?, ?, 'admin', ?, 'training', ?, 1.0)",
            (seq, f"j{seq}", spec, state),
        )
        return f"j{seq}"

    with sqlite3.connect(data / st.DB_NAME) as conn:  # the jobs that follow get j101, j102...
        insert(conn, 100, '{"command": ["true"]}', "done")
    p = _plane(data)
    p.start()
    try:
        big = p.submit(_req("sleep", "60", gpus=8), ADMIN).job_id
        until(lambda: _state(p, big) == st.RUNNING, 20, "8-GPU job running")
    finally:
        p.close()  # a clean stop: the 8-GPU job keeps running
    # submitted before it, as an older version stored them (they passed its validation, then
    # made it answer 500): at the restart their events come first
    with sqlite3.connect(data / st.DB_NAME) as conn:
        inf = insert(conn, 5, '{"command": ["true"], "est_runtime_s": Infinity}', "pending")
        bad = insert(conn, 6, '{"command": ["\\ud800"]}', "pending")
    p2 = _plane(data)
    p2.start()
    try:
        small = p2.submit(_req("sleep", "0.1", gpus=1), ADMIN).job_id
        time.sleep(1.0)
        assert _state(p2, small) == st.PENDING, "ran on a GPU the restored job holds"
        assert _state(p2, big) == st.RUNNING and big in p2.reconciler.live
        until(lambda: _state(p2, bad) == st.REJECTED, 10, "unrepairable job rejected")
        row = p2.job(bad, ADMIN)
        assert row is not None and "command" in row.message and row.reason == "invalid"
        assert _state(p2, inf) == st.PENDING  # repaired (estimate dropped), waits its turn
        p2.cancel(big, ADMIN)
        until(lambda: _state(p2, small) == st.DONE, 30, "the small job after the big one")
        until(lambda: _state(p2, inf) == st.DONE, 30, "the repaired job")
    finally:
        p2.close(kill_jobs=True)
    assert joblogs.max_per_device(joblogs.runs(data, node="local-0")) == 1


# ---------------------------------------------------------------------- case 3
def _kill_keepers(data: Path, jid: str) -> None:
    """SIGKILL the member's supervisor (rank-0.pid) and its launcher (rank-0.started): with
    both gone nobody can learn how the job ends (either alone records it: issue 30, case 5)."""
    supervisor = int(record(data, jid, 1, 0, "pid")["pid"])  # type: ignore[call-overload]
    launcher = int(record(data, jid, 1, 0, "started")["launcher"])  # type: ignore[call-overload]
    for pid in (supervisor, launcher):
        os.kill(pid, signal.SIGKILL)
        until(lambda pid=pid: not alive(pid), 5, f"{pid} gone")  # type: ignore[misc]


def test_a_launcher_killed_while_the_server_is_down_never_runs_twice(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    server = up(data)
    # attempt 1 runs long (it is still running when the server comes back), attempt 2 briefly
    script = (
        "import os, runpy, sys; s = '60' if os.environ['GPUFENCE_ATTEMPT'] == '1' else '0.5';"
        "sys.argv = ['programs', 'sleep', s]; runpy.run_module('gpufence.demo.programs',"
        " run_name='__main__')"
    )
    try:
        c = client(data)
        jid = c.submit({"command": [sys.executable, "-c", script], "gpus": 1})["id"]
        until(lambda: record_file(data, jid, 1, 0, "started").exists(), 20, "run")
        kill9(server)
        command = int(record(data, jid, 1, 0, "started")["pid"])  # type: ignore[call-overload]
        _kill_keepers(data, jid)  # the OOM killer, while nobody watches
        assert alive(command)
        server = up(data)
        assert not alive(command), "the restart left the old attempt's command running"
        c = client(data)
        until(lambda: c.job(jid)["state"] == "done", 30, "requeued job done")
        assert c.job(jid)["attempt"] == 2
    finally:
        stop(server)
    assert _ends(data) == {jid: 1}, "completed more than once"
    runs = joblogs.runs(data, node="local-0")
    first = [r for r in runs if r.attempt == 1]
    second = [r for r in runs if r.attempt == 2]
    assert first and second and first[0].end <= second[0].start, "attempts overlapped"


ESCAPE_THEN_SLEEP = (
    "import os, runpy, subprocess, sys\n"
    "if os.environ['GPUFENCE_ATTEMPT'] == '1':\n"
    "    d = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
    "    ck = os.environ['GPUFENCE_CHECKPOINT_DIR']\n"
    "    open(os.path.join(ck, 'escaped.tmp'), 'w').write(str(d.pid))\n"
    "    os.replace(os.path.join(ck, 'escaped.tmp'), os.path.join(ck, 'escaped'))\n"
    "s = '60' if os.environ['GPUFENCE_ATTEMPT'] == '1' else '0.5'\n"
    "sys.argv = ['programs', 'sleep', s]\n"
    "runpy.run_module('gpufence.demo.programs', run_name='__main__')\n"
)


def test_a_dead_launchers_setsid_escapee_is_killed_with_its_cgroup_before_the_requeue(
    tmp_path: Path,
) -> None:
    """Case 3 with containment (issue 12): the job also left a process in a session of its
    own, outside its process group. The restarted server kills the member's whole cgroup
    before it serves (and so before the job is requeued), and removes the cgroup."""
    data = tmp_path / "data"
    data.mkdir()
    server = up(data)
    escaped = data / "jobs" / "j1" / "checkpoints" / "escaped"
    try:
        c = client(data)
        jid = c.submit({"command": [sys.executable, "-c", ESCAPE_THEN_SLEEP], "gpus": 1})["id"]
        until(
            lambda: escaped.exists() and record_file(data, jid, 1, 0, "started").exists(), 20, "run"
        )
        if "containment: cgroup" not in last_log(data):
            pytest.skip(f"gpufence up ran without containment here: {last_log(data)[-300:]}")
        kill9(server)
        escapee = int(escaped.read_text())
        _kill_keepers(data, jid)
        assert alive(escapee)
        server = up(data)
        assert not alive(escapee), "the restart left the old attempt's setsid child running"
        assert "stray" in last_log(data) or "still run in it" in last_log(data)
        c = client(data)
        until(lambda: c.job(jid)["state"] == "done", 30, "requeued job done")
        assert c.job(jid)["attempt"] == 2
    finally:
        stop(server)
    assert _ends(data) == {jid: 1}, "completed more than once"


# ---------------------------------------------------------------------- case 4
def test_one_control_plane_per_store_even_without_the_lock_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    first = up(data)
    try:
        for stale in data.glob("*.lock"):  # the "stale lock" habit
            stale.unlink()
        second = up(data, expect_running=False)
        assert second.wait(60) == 2
        refusal = last_log(data)
        assert "another gpufence control plane uses the store" in refusal
        # the refusal is the whole answer: no traceback after it (the half-made lock's __del__)
        assert "Traceback" not in refusal and "Exception ignored" not in refusal, refusal
        # the first one still owns it and works
        assert client(data).submit({"command": ["true"]})["state"] in ("pending", "running")
    finally:
        stop(first)


def test_a_store_deleted_under_a_running_plane_stops_its_writes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    first = up(data)
    try:
        c = client(data)
        jid = c.submit({"command": [*JOB, "sleep", "30"], "gpus": 1})["id"]
        until(lambda: c.job(jid)["state"] == "running", 20, "running")
        for f in data.glob("gpufence.db*"):
            f.unlink()
        # readiness says so at once, before any write has failed on it
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{c.url}/readyz", timeout=30)
        assert err.value.code == 503
        assert "deleted or moved" in json.loads(err.value.read())["detail"]
        req = urllib.request.Request(
            f"{c.url}/v1/jobs",
            data=b'{"command": ["true"]}',
            headers={"Authorization": f"Bearer {c.token()}", "Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 503
        assert "deleted or replaced" in json.loads(err.value.read())["detail"]
        second = up(data, expect_running=False)
        assert second.wait(60) == 2
        assert "is missing, but jobs of this data directory still run" in last_log(data)
    finally:
        kill9(first)
        kill_leftovers(data)  # its jobs, and their cgroups (no control plane is left to)


# ---------------------------------------------------------------------- case 5
def test_a_crash_between_two_spawns_requeues_the_gang(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    fail = {"GPUFENCE_FAILPOINTS": "executor.between-spawns=crash"}
    server = up(data, env=fail)
    jid = ""
    try:
        c = client(data)
        gang = {"command": [*JOB, "sleep", "1"], "gpus": 1, "replicas": 2}
        key = "gang-between-spawns"
        try:
            jid = c.submit(gang, idempotency_key=key, patience_s=2.0)["id"]
        except ClientError:
            # the crash follows the submit's answer by milliseconds: under load the server can
            # die before that answer is written out, as the client says; the key then gets the
            # job from the restarted server (below), never a second one
            jid = ""
        server.wait(30)  # died between rank 0 and rank 1
        server = up(data)
        c = client(data)
        again = c.submit(gang, idempotency_key=key)
        assert again["id"] == jid or not jid, (again, jid)
        jid = again["id"]
        assert record_file(data, jid, 1, 0, "pid").exists()
        assert not record_file(data, jid, 1, 1, "pid").exists()  # rank 1 never started
        until(lambda: c.job(jid)["state"] in ("done", "failed"), 30, "gang settled")
        job = c.job(jid)
        assert job["state"] == "done" and job["attempt"] == 2, job
    finally:
        stop(server)
    runs = joblogs.runs(data, node="local-0")
    assert {(r.attempt, r.rank) for r in runs if r.job == jid} >= {(2, 0), (2, 1)}
    assert joblogs.max_per_device(runs) == 1


# ---------------------------------------------------------------------- case 7
def _corrupt(db: Path) -> None:
    size = db.stat().st_size
    assert size >= 3 * 4096, size
    with db.open("r+b") as fh:
        fh.seek(2 * 4096)
        fh.write(os.urandom(4096))


def test_a_damaged_store_is_refused_unless_told_otherwise(tmp_path: Path) -> None:
    data = tmp_path / "data"
    p = _plane(data)
    p.start()
    try:
        for i in range(200):  # long names fill pages; names are unique among jobs not ended
            p.submit(_req("sleep", "0", gpus=1, name=f"{i:03d}" + "x" * 97), ADMIN)
    finally:
        p.close(kill_jobs=True)
    with sqlite3.connect(data / st.DB_NAME) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    _corrupt(data / st.DB_NAME)
    server = up(data, expect_running=False)
    assert server.wait(60) == 2
    text = last_log(data)
    assert "is damaged" in text and "--skip-integrity-check" in text and "Traceback" not in text
    # told to skip the check, start-up still reads the damaged pages: no way out is offered
    # that the operator just took
    server = up(data, "--skip-integrity-check", expect_running=False)
    assert server.wait(60) == 2
    text = last_log(data)
    assert "cannot start on it as it is" in text and ".recover" in text, text
    assert "--skip-integrity-check" not in text.split("error:")[-1], text


def test_a_missing_store_keeps_ids_and_logs_of_the_old_one(tmp_path: Path) -> None:
    data = tmp_path / "data"
    p = _plane(data)
    p.start()
    try:
        old = p.submit(_req("sleep", "0", gpus=1), ADMIN).job_id
        until(lambda: _state(p, old) == st.DONE, 20, "done")
    finally:
        p.close()
    log = data / "jobs" / old / "attempt-1" / "rank-0.out"
    before = log.read_text()
    for f in data.glob("gpufence.db*"):
        f.unlink()
    # a new store is refused while the marker says one was made here (issue 30, case 9)...
    with pytest.raises(st.StoreError, match=r"delete .*store\.id"):
        _plane(data)
    (data / "store.id").unlink()  # ...until the operator says to start afresh
    p2 = _plane(data)
    p2.start()
    try:
        new = p2.submit(_req("sleep", "0", gpus=1), ADMIN).job_id
        until(lambda: _state(p2, new) == st.DONE, 20, "done")
    finally:
        p2.close()
    assert int(new[1:]) > int(old[1:]), (old, new)
    assert log.read_text() == before, "an old job's log was overwritten"


def test_ids_never_go_backwards_after_a_refused_submit_and_a_restart(tmp_path: Path) -> None:
    """A submit that failed after its id was taken left the in-memory counter ahead of the
    store: the first submit after every restart then failed with a UNIQUE constraint."""
    data = tmp_path / "data"
    data.mkdir()
    server = up(data)
    try:
        c = client(data)
        a = c.submit({"command": ["true"]})["id"]
        with pytest.raises(ClientError):  # passed the old validation, failed inside
            c.submit({"command": ["true"], "gpu_fraction": 0.5, "gpu_mem_gib": 1e308})
        b = c.submit({"command": ["true"]})["id"]
        stop(server)
        server = up(data)
        c = client(data)
        d = c.submit({"command": ["true"]})["id"]
        assert int(a[1:]) < int(b[1:]) < int(d[1:])
        assert len({j["id"] for j in c.jobs()}) == 3
    finally:
        stop(server)


# ---------------------------------------------------------------------- case 8
def test_the_same_idempotency_key_after_a_crash_returns_the_same_job(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    server = up(data)
    try:
        first = client(data).submit({"command": ["true"]}, idempotency_key="k-123")
        kill9(server)  # the client never saw its 201
        server = up(data)
        again = client(data).submit({"command": ["true"]}, idempotency_key="k-123")
        assert again["id"] == first["id"]
        assert [j["id"] for j in client(data).jobs()] == [first["id"]]
    finally:
        stop(server)


def test_attempts_the_store_lost_are_settled_from_their_records(tmp_path: Path) -> None:
    """A disk repaired by fsck (or a store restored from a backup) can lack the store's last
    writes: a Bind, an exit. The job is ``pending`` again while its attempt directory shows the
    run. A completed run must not run again; one still running is not guessed about: the
    start is refused naming it (store.strangers), and once it is stopped it is replaced."""
    data = tmp_path / "data"
    p = _plane(data)
    p.start()
    try:
        done = p.submit(_req("sleep", "0.2", gpus=1), ADMIN).job_id
        running = p.submit(_req("sleep", "60", gpus=1), ADMIN).job_id
        until(lambda: _state(p, done) == st.DONE, 20, "done")
        until(lambda: _state(p, running) == st.RUNNING, 20, "running")
    finally:
        p.close()
    with sqlite3.connect(data / st.DB_NAME) as conn:  # what a lost tail of the WAL leaves
        for jid in (done, running):
            conn.execute("UPDATE jobs SET state='pending', started_at=NULL WHERE id=?", (jid,))
            conn.execute("DELETE FROM attempts WHERE job_id=?", (jid,))
    command = int(record(data, running, 1, 0, "started")["pid"])  # type: ignore[call-overload]
    assert alive(command)
    p2 = _plane(data)
    with pytest.raises(st.StoreError, match=f"{running} attempt 1"):
        p2.start()
    p2.close()
    assert alive(command), "refused, not killed"
    kill_leftovers(data, only=running)  # the operator stops it
    p2 = _plane(data)
    p2.start()
    try:
        assert not alive(command)
        assert _state(p2, done) == st.DONE
        until(lambda: _attempt(p2, running) == 2, 10, "attempt 2 of the lost one")
        time.sleep(0.5)
        assert not (data / "jobs" / done / "attempt-2").exists(), "a completed job ran again"
    finally:
        p2.close(kill_jobs=True)
    assert _ends(data).get(done) == 1
