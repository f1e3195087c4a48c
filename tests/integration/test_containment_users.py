"""Run-as: a job runs as its tenant's Unix user; what the executor creates is owned accordingly;
it starts in its own directory (or its cwd, entered as its user) and reads its notice file.

A throw-away user (``useradd``, removed after) runs the job, with and without cgroups. The job's
attempt and checkpoint directories are its own, mode 0700; its logs 0600; the launcher's records
stay the control plane's; the directories above only let the user pass through.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from containment_helpers import (
    clear,
    executor,
    launcher_born,
    make_driver,
    unique,
    unix_user,
    uptime_ticks,
    wait_spares,
)
from executor_helpers import Recorder, make_launch

from gpufence.control.base.member_records import records_dir
from gpufence.control.containment.cgroup import CgroupDriver
from gpufence.testing.waiting import file_appears

WHO = """
    import errno, json, os, sys
    ck = os.environ["GPUFENCE_CHECKPOINT_DIR"]
    with open(os.path.join(ck, "model.pt"), "w") as fh:
        fh.write("weights")
    try:
        open(sys.argv[1]).read()
        secret = "read"
    except OSError as exc:
        secret = errno.errorcode[exc.errno]
    print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()),
                      "euid": os.geteuid(), "secret": secret}))
"""


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture
def passable() -> Iterator[Path]:
    """A directory another user may pass through (pytest's tmp_path sits under a 0700 one)."""
    d = Path(tempfile.mkdtemp(prefix=unique("gpufence-users")))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _python() -> str:
    """An interpreter another user may run (the test's own may live under /root)."""
    for p in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(p, os.X_OK) and os.stat(p).st_mode & 0o001:
            return p
    pytest.skip("no world-executable python3 for the job's user")


@pytest.mark.parametrize(("contained", "prestarted"), [(False, 0), (True, 0), (True, 2)])
def test_the_job_runs_as_its_user_and_owns_its_directories(
    passable: Path, cgroup_parent: str, contained: bool, prestarted: int
) -> None:
    driver: CgroupDriver | None = make_driver("v1", cgroup_parent) if contained else None
    data = passable / "data"
    data.mkdir(mode=0o700)
    secret = data / "admin.token"  # what a server keeps next to the jobs, 0600
    secret.write_text("s3cret")
    secret.chmod(0o600)
    rec = Recorder()
    with unix_user() as user:
        launch = make_launch(
            data, command=(_python(), "-c", textwrap.dedent(WHO), str(secret)), run_as=user
        )
        try:
            with executor(driver, prestarted=prestarted) as ex:
                ex.set_callbacks(rec.on_exit, rec.on_ack)
                if driver is not None:
                    wait_spares(driver, prestarted)
                before = uptime_ticks()
                ex.start(launch)
                ev = rec.exit(timeout=10)[1]
        finally:
            if driver is not None:
                clear(driver)
        out = (launch.attempt_dir / "rank-0.out").read_text()
        assert ev.succeeded, out + (launch.attempt_dir / "rank-0.err").read_text()
        assert (launcher_born(launch.attempt_dir) < before) == bool(prestarted)
        seen = json.loads(out)
        assert (seen["uid"], seen["euid"], seen["gid"]) == (user.uid, user.uid, user.gid)
        assert seen["groups"] == [user.gid]  # root's supplementary groups are gone
        assert seen["secret"] == "EACCES"
        adir, ck = launch.attempt_dir, launch.checkpoint_dir
        for d in (adir, ck):
            assert (d.stat().st_uid, d.stat().st_gid, _mode(d)) == (user.uid, user.gid, 0o700)
        for log in ("rank-0.out", "rank-0.err"):
            f = adir / log
            assert (f.stat().st_uid, _mode(f)) == (user.uid, 0o600)
        records = records_dir(adir)  # the launcher's own, where the job cannot write
        assert (records.stat().st_uid, _mode(records)) == (os.getuid(), 0o700)
        for rec_file in ("rank-0.pid", "rank-0.exit", "rank-0.started"):
            assert (records / rec_file).stat().st_uid == os.getuid()
            assert not (adir / rec_file).exists()
        assert (ck / "model.pt").stat().st_uid == user.uid
        for d in (adir.parent, adir.parent.parent, data):  # DATA/jobs/JOB, DATA/jobs, DATA
            assert _mode(d) & 0o011 == 0o011 and _mode(d) & 0o004 == 0, (d, oct(_mode(d)))


NOTICED = """
    import json, os, signal, sys, time
    signal.signal(signal.SIGUSR1, lambda *_: None)
    print(json.dumps({"cwd": os.getcwd()}), flush=True)
    open(os.path.join(os.environ["GPUFENCE_CHECKPOINT_DIR"], "ready"), "w").close()
    path = os.environ["GPUFENCE_NOTICE_FILE"]
    while not os.path.exists(path):
        time.sleep(0.02)
    print(json.dumps({"notice": json.load(open(path))}), flush=True)
"""


@pytest.mark.parametrize(("contained", "prestarted"), [(False, 0), (True, 0), (True, 2)])
def test_a_job_starts_in_its_own_directory_and_reads_its_notice(
    passable: Path, cgroup_parent: str, contained: bool, prestarted: int
) -> None:
    """Without a cwd the job starts in its attempt directory (the server's working directory
    may be one its user cannot enter), and the notice file the root executor writes there is
    the job user's to read."""
    driver: CgroupDriver | None = make_driver("v1", cgroup_parent) if contained else None
    rec = Recorder()
    with unix_user() as user:
        launch = make_launch(
            passable / "data", command=(_python(), "-c", textwrap.dedent(NOTICED)), run_as=user
        )
        try:
            with executor(driver, prestarted=prestarted) as ex:
                ex.set_callbacks(rec.on_exit, rec.on_ack)
                if driver is not None:
                    wait_spares(driver, prestarted)
                ex.start(launch)
                file_appears(launch.checkpoint_dir / "ready", 10)
                ex.notice(launch.job_id, launch.attempt, "preempt", 123.0)
                ev = rec.exit(timeout=10)[1]
        finally:
            if driver is not None:
                clear(driver)
        adir = launch.attempt_dir
        out = [json.loads(line) for line in (adir / "rank-0.out").read_text().splitlines()]
        assert ev.succeeded, out
        assert out == [
            {"cwd": str(adir)},
            {"notice": {"reason": "preempt", "deadline_unix": 123.0}},
        ]
        assert (adir / "notice").stat().st_uid == user.uid


@pytest.mark.parametrize(("contained", "prestarted"), [(False, 0), (True, 2)])
def test_a_working_directory_its_user_cannot_enter_fails_the_start(
    tmp_path: Path, passable: Path, cgroup_parent: str, contained: bool, prestarted: int
) -> None:
    """The job enters its cwd as its own user: one behind a directory only root may pass
    (pytest's tmp_path) is refused with a message, never entered with the server's rights."""
    hidden = tmp_path / "project"  # /tmp/pytest-of-root/... is 0700
    hidden.mkdir()
    hidden.chmod(0o777)
    driver: CgroupDriver | None = make_driver("v1", cgroup_parent) if contained else None
    rec = Recorder()
    with unix_user() as user:
        launch = make_launch(
            passable / "data", command=(_python(), "-c", "print('ran')"), run_as=user, cwd=hidden
        )
        try:
            with executor(driver, prestarted=prestarted) as ex:
                ex.set_callbacks(rec.on_exit, rec.on_ack)
                if driver is not None:
                    wait_spares(driver, prestarted)
                ex.start(launch)
                ev = rec.exit(timeout=10)[1]
        finally:
            if driver is not None:
                clear(driver)
    err = (launch.attempt_dir / "rank-0.err").read_text()
    assert ev.codes == (125,), err
    assert f"cannot enter the working directory {hidden} as uid {user.uid}" in err
    assert "Permission denied" in err
    assert (launch.attempt_dir / "rank-0.out").read_text() == ""
