"""A job owns its attempt directory; what it plants there must not steer the root control plane.

* a forged ``rank-R.pid`` (naming someone else's process) cannot make adoption signal or kill
  that process: the launcher's records live in the server's ``attempt-N.records``, which the job
  cannot write;
* records of an attempt from before that move are still adopted where only the server's user
  could have written them, and refused (the member taken as ended, nothing signalled by pid)
  where the job's user could;
* a link planted where a log should be is never followed: not by the executor resetting an old
  attempt directory, not by the launcher opening its logs.

Real executors, real processes, real Unix users (``useradd``, removed after), real cgroups.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from containment_helpers import clear, executor, make_driver, unique, unix_user
from executor_helpers import Recorder, make_launch

from gpufence.control.base.containment_settings import ContainmentSettings
from gpufence.control.base.executor import RunAs
from gpufence.control.base.jobdirs import prepare_job_dirs, reset_attempt
from gpufence.control.base.launcher import EXIT_NOT_CONTAINED
from gpufence.control.base.member_records import (
    exit_file,
    pid_record,
    proc_start_time,
    records_dir,
)
from gpufence.control.containment.cgroup import CgroupDriver
from gpufence.control.containment.members import Containment
from gpufence.control.executors.local.local_executor import LocalExecutor
from gpufence.control.executors.processes import LAUNCHER
from gpufence.testing.waiting import file_appears

FORGE = """
    import json, os, sys, time
    adir = os.path.dirname(os.environ["GPUFENCE_NOTICE_FILE"])
    tried = {}
    for path in (adir + "/rank-0.pid", adir + ".records/rank-0.pid"):
        try:
            with open(path + ".tmp", "w") as fh:
                fh.write(sys.argv[1])
            os.replace(path + ".tmp", path)
            tried[path] = "written"
        except OSError as exc:
            tried[path] = type(exc).__name__
    print(json.dumps(tried), flush=True)
    open(os.path.join(os.environ["GPUFENCE_CHECKPOINT_DIR"], "forged"), "w").close()
    time.sleep(60)
"""


@pytest.fixture
def passable() -> Iterator[Path]:
    """A directory another user may pass through (pytest's tmp_path sits under a 0700 one)."""
    d = Path(tempfile.mkdtemp(prefix=unique("gpufence-tamper")))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """Someone else's process, leader of its own process group."""
    p = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield p
    p.kill()
    p.wait()


def _python() -> str:
    for p in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(p, os.X_OK) and os.stat(p).st_mode & 0o001:
            return p
    pytest.skip("no world-executable python3 for the job's user")


def _driver(mode: str, cgroup_parent: str) -> CgroupDriver | None:
    return make_driver("v1", cgroup_parent) if mode == "v1" else None


@pytest.mark.parametrize("mode", ["none", "v1"])
def test_a_forged_pid_record_cannot_make_adoption_kill_another_process(
    passable: Path, cgroup_parent: str, victim: subprocess.Popen[bytes], mode: str
) -> None:
    driver = _driver(mode, cgroup_parent)
    try:
        _forge_and_adopt(passable, driver, victim)
    finally:
        if driver is not None:
            clear(driver)


def _forge_and_adopt(
    passable: Path, driver: CgroupDriver | None, victim: subprocess.Popen[bytes]
) -> None:
    start = proc_start_time(victim.pid)
    assert start is not None
    forged = pid_record(victim.pid, start)
    data = passable / "data"
    with unix_user() as user:
        launch = make_launch(
            data, command=(_python(), "-c", textwrap.dedent(FORGE), forged), run_as=user
        )
        contain = Containment(driver, ContainmentSettings(prestarted=0)) if driver else None
        first = LocalExecutor(containment=contain)
        first.start(launch)
        file_appears(launch.checkpoint_dir / "forged", 10)
        first.close(kill=False)  # the control plane goes away; the job (and its forgery) stay
        rec = Recorder()
        with executor(driver) as second:
            second.set_callbacks(rec.on_exit, rec.on_ack)
            assert second.adopt(launch) is True  # the real launcher, found by the real record
            second.stop(launch.job_id, launch.attempt, grace_s=0.5)
            _, ev = rec.exit(timeout=10)
        assert ev.stopped
        assert victim.poll() is None, "adoption signalled the process the forged record named"
        tried = json.loads((launch.attempt_dir / "rank-0.out").read_text())
        adir = str(launch.attempt_dir)
        assert tried == {
            f"{adir}/rank-0.pid": "written",  # its own directory: it may write what it likes
            f"{adir}.records/rank-0.pid": "PermissionError",  # the records: not the job's
        }


def _old_attempt(data: Path, run_as: RunAs | None, victim: int) -> Path:
    """An attempt directory as gpufence left it before the records moved out of it: its pid
    record names ``victim``, its exit record says 0, and there is no records directory."""
    adir = data / "jobs" / "job-1" / "attempt-1"
    adir.mkdir(parents=True, mode=0o700)
    start = proc_start_time(victim)
    (adir / "rank-0.pid").write_text(pid_record(victim, start or 0))
    (adir / "rank-0.exit").write_text(json.dumps({"code": 0, "ended_unix": 1.0}))
    if run_as is not None:
        os.chown(adir, run_as.uid, run_as.gid)
    return adir


def test_old_records_in_a_job_writable_directory_are_refused_on_adoption(
    tmp_path: Path, victim: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    with unix_user() as user:
        _old_attempt(tmp_path, user, victim.pid)
        launch = make_launch(tmp_path, command=("true",), run_as=user)
        rec = Recorder()
        with executor(None) as ex, caplog.at_level(logging.ERROR, "gpufence.executor"):
            ex.set_callbacks(rec.on_exit, rec.on_ack)
            assert ex.adopt(launch) is False
            _, ev = rec.exit(timeout=10)
            ex.stop(launch.job_id, launch.attempt, grace_s=0)
    assert ev.codes == (None,), "neither the forged pid nor the forged exit code is believed"
    assert victim.poll() is None
    assert "not trusted" in caplog.text and f"uid {user.uid}" in caplog.text


def test_old_records_the_server_alone_could_write_are_still_adopted(
    tmp_path: Path, victim: subprocess.Popen[bytes]
) -> None:
    """A member started before the upgrade (as the server's user, records in ``attempt-N``):
    adopted as before, and stopped through its process group."""
    adir = _old_attempt(tmp_path, None, victim.pid)
    (adir / "rank-0.exit").unlink()  # still running
    launch = make_launch(tmp_path, command=("sleep", "60"))
    rec = Recorder()
    with executor(None) as ex:
        ex.set_callbacks(rec.on_exit, rec.on_ack)
        assert ex.adopt(launch) is True
        ex.stop(launch.job_id, launch.attempt, grace_s=0.5)
        _, ev = rec.exit(timeout=10)
    assert ev.stopped
    assert victim.wait(5) is not None, "the adopted member was stopped"


def test_resetting_an_old_attempt_directory_follows_no_link(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (the server's position)")
    with unix_user() as user:
        os.chmod(tmp_path, 0o711)
        adir = tmp_path / "data" / "jobs" / "j1" / "attempt-1"
        assert prepare_job_dirs(adir, adir.parent / "checkpoints", user, [0, 1])
        precious = tmp_path / "precious"
        precious.write_text("do not truncate")
        # what a job of that user could leave behind in its own directory
        (adir / "rank-0.out").unlink()
        (adir / "rank-0.out").symlink_to(precious)
        (adir / "rank-1.err").unlink()
        os.link(precious, adir / "rank-1.err")
        (adir / "notice").symlink_to(precious)
        assert not prepare_job_dirs(adir, adir.parent / "checkpoints", user, [0, 1])
        reset_attempt(adir, user, [0, 1])
        assert precious.read_text() == "do not truncate"
        for name in ("rank-0.out", "rank-0.err", "rank-1.out", "rank-1.err"):
            st = (adir / name).lstat()
            assert (st.st_size, st.st_nlink, st.st_uid) == (0, 1, user.uid), name
        assert not (adir / "notice").exists() and not (adir / "notice").is_symlink()


@pytest.mark.parametrize("planted", ["symlink", "hardlink", "fifo"])
def test_the_launcher_writes_no_log_through_what_the_job_planted(
    tmp_path: Path, planted: str
) -> None:
    """The launcher (root) opens ``rank-R.out`` in a directory the job owns: a link or a FIFO
    put there since the executor made the file is refused (code 125), never written through."""
    adir = tmp_path / "attempt-1"
    adir.mkdir()
    precious = tmp_path / "precious"
    precious.write_text("keep")
    out = adir / "rank-0.out"
    if planted == "symlink":
        out.symlink_to(precious)
    elif planted == "hardlink":
        os.link(precious, out)
    else:
        os.mkfifo(out)
    run = subprocess.run(
        [sys.executable, "-I", "-S", str(LAUNCHER), str(adir), "--rank", "0", "--", "echo", "hi"],
        capture_output=True,
        timeout=30,
    )
    assert run.returncode == EXIT_NOT_CONTAINED, run
    assert b"not a plain file" in run.stderr
    assert precious.read_text() == "keep"
    assert json.loads(exit_file(adir, 0).read_text())["code"] == EXIT_NOT_CONTAINED
    assert stat_mode(records_dir(adir)) == 0o700


def stat_mode(p: Path) -> int:
    return p.stat().st_mode & 0o777
