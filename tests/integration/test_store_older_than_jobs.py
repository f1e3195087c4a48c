"""Issue 11 (never double-book): a store older than its data directory -- restored from a backup,
or a data directory deleted and recreated while its jobs ran -- does not know jobs that still
hold GPUs. ``gpufence up`` refuses it, naming them, instead of starting with their GPUs "free".
Real servers, real processes, real SQLite files; the deleted-directory case needs containment
(the member cgroups are all that is left of those jobs) and is skipped, saying why, without it.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from server_proc import JOB, alive, client, kill9, last_log, record, stop, up

from gpufence.control.store import database as st
from gpufence.testing.crashrun import kill_leftovers
from gpufence.testing.waiting import until


def _backup(data: Path, to: Path) -> None:
    """A consistent copy of the live store (SQLite's online backup: what an operator's cron
    job would take)."""
    with sqlite3.connect(data / st.DB_NAME) as src, sqlite3.connect(to) as dst:
        src.backup(dst)


def _restore(data: Path, backup: Path) -> None:
    for f in data.glob(f"{st.DB_NAME}*"):
        f.unlink()
    shutil.copyfile(backup, data / st.DB_NAME)


def _restart_on(data: Path, backup: Path, server: subprocess.Popen[bytes]) -> str:
    """kill -9 the control plane, put the backup in place of its store, start again: the
    start must be refused (exit 2); its log."""
    kill9(server)
    _restore(data, backup)
    refused = up(data, expect_running=False)
    assert refused.wait(60) == 2
    return last_log(data)


def _running(data: Path, command: list[str], gpus: int) -> str:
    c = client(data)
    jid = str(c.submit({"command": command, "gpus": gpus})["id"])
    until(lambda: c.job(jid)["state"] == "running", 30, f"{jid} running")
    return jid


def test_a_restored_backup_that_misses_a_running_job_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    backup = tmp_path / "backup.db"
    server = up(data)
    try:
        old = _running(data, [*JOB, "sleep", "60"], 1)
        _backup(data, backup)  # knows `old`, not what comes next
        new = _running(data, [*JOB, "sleep", "60"], 2)
        text = _restart_on(data, backup, server)
        assert "still run that the store" in text and f"{new} attempt 1 (pid " in text, text
        assert f"{old} attempt" not in text.split("does not know")[-1]  # the store knows it
        assert "Traceback" not in text
        # the operator stops the stranger; then the restored store starts, adopts `old`, and
        # new ids continue after `new` (its directory and logs are kept)
        kill_leftovers(data, only=new)
        server = up(data)
        c = client(data)
        assert c.job(old)["state"] == "running"
        nxt = str(c.submit({"command": ["true"]})["id"])
        assert int(nxt[1:]) > int(new[1:]), (nxt, new)
        assert (data / "jobs" / new / "attempt-1").is_dir()
        assert "belong to no job of the store" in last_log(data)
    finally:
        stop(server)
        kill_leftovers(data)


def test_a_restored_backup_that_misses_a_later_attempt_is_refused(tmp_path: Path) -> None:
    """The backup says attempt 1 runs; attempt 2 does (attempt 1 was lost since: its processes
    were killed while the control plane was down, so the next start requeued it)."""
    data = tmp_path / "data"
    data.mkdir()
    backup = tmp_path / "backup.db"
    server = up(data)
    try:
        c = client(data)
        jid = str(c.submit({"command": [*JOB, "sleep", "60"], "gpus": 1, "max_attempts": 3})["id"])
        until(lambda: c.job(jid)["state"] == "running", 30, "attempt 1 running")
        _backup(data, backup)
        kill9(server)
        # supervisor and launcher both: no exit record, attempt 1 is lost, requeued at start
        for pid in (
            record(data, jid, 1, 0, "pid")["pid"],
            record(data, jid, 1, 0, "started")["launcher"],
        ):
            os.kill(int(str(pid)), signal.SIGKILL)
        server = up(data)
        c = client(data)
        until(lambda: c.job(jid)["attempt"] == 2 and c.job(jid)["state"] == "running", 30, "2")
        text = _restart_on(data, backup, server)
        assert f"{jid} attempt 2 (pid " in text and f"{jid} attempt 1" not in text, text
    finally:
        kill9(server)
        kill_leftovers(data)


def test_a_deleted_data_directory_leaves_cgroups_that_refuse_the_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    server = up(data)
    try:
        if "containment:" not in last_log(data):  # `up` ran with --no-containment
            reason = "no containment here: a deleted data directory leaves no trace to find"
            print(f"SKIPPED: {reason}", file=sys.stderr)
            pytest.skip(reason)
        jid = _running(data, [*JOB, "sleep", "60"], 1)
        kill9(server)
        shutil.rmtree(data)  # the operator's "start from scratch", with a job still running
        data.mkdir()
        server = up(data, expect_running=False)
        assert server.wait(60) == 2
        text = last_log(data)
        assert f"{jid} attempt 1 (pid " in text and "does not know" in text, text
    finally:
        kill9(server)
        kill_leftovers(data)


def test_a_released_job_the_backup_has_held_is_refused_not_killed(tmp_path: Path) -> None:
    """The backup says pending (held); the job was released since and runs. Its bind was
    committed before it started, so only a newer store knew it: refused, not killed."""
    data = tmp_path / "data"
    data.mkdir()
    backup = tmp_path / "backup.db"
    server = up(data)
    try:
        c = client(data)
        jid = str(c.submit({"command": [*JOB, "sleep", "60"], "gpus": 1, "hold": True})["id"])
        _backup(data, backup)
        c.release(jid)
        until(lambda: c.job(jid)["state"] == "running", 30, "running")
        assert f"{jid} attempt 1 (pid " in _restart_on(data, backup, server)
        assert alive(int(str(record(data, jid, 1, 0, "pid")["pid"])))  # not killed
    finally:
        kill9(server)
        kill_leftovers(data)


def test_jobs_on_gpus_the_cluster_no_longer_has_refuse_the_start(tmp_path: Path) -> None:
    """Restarted with fewer --fake-gpus while a job runs on GPUs 2-3: it was cancelled (its
    restore failed, with a traceback); now `up` names it and exits, and it runs on."""
    data = tmp_path / "data"
    data.mkdir()
    server = up(data, gpus=4)
    try:
        first = _running(data, [*JOB, "sleep", "60"], 2)
        second = _running(data, [*JOB, "sleep", "60"], 2)
        kill9(server)
        server = up(data, gpus=2, expect_running=False)
        assert server.wait(60) == 2
        text = last_log(data)
        assert "GPUs this cluster does not have" in text and f"{second} attempt 1" in text, text
        assert f"{first} attempt" not in text.split("does not have")[-1]  # GPUs 0-1 still exist
        assert "Traceback" not in text
        server = up(data, gpus=4)  # the cluster they run on: adopted, as ever
        assert client(data).job(second)["state"] == "running"
    finally:
        stop(server)
        kill_leftovers(data)
