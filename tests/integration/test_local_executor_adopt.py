"""LocalExecutor adoption: a restarted control plane adopts (or refuses) earlier attempts.

Every test runs real subprocesses in ``tmp_path`` with short sleeps; the file takes a few seconds.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from executor_helpers import (
    Recorder,
    gone,
    make_launch,
    recorded,
    start_and_abandon,
)

from gpufence.control.base.executor import AttemptExit, LaunchError, Member
from gpufence.control.base.member_records import exit_file, pid_file, records_dir, started_file
from gpufence.control.executors.local.local_executor import LocalExecutor
from gpufence.control.executors.processes import spawn_member
from gpufence.testing.waiting import file_appears, until

ENDS_WITH_5 = """
    import os, sys, time
    open(os.path.join(os.environ["GPUFENCE_CHECKPOINT_DIR"], "ready"), "w").close()
    time.sleep(0.8)
    sys.exit(5)
"""


def test_adopt_a_running_attempt_after_restart(tmp_path: Path, rec: Recorder) -> None:
    launch = make_launch(tmp_path, ENDS_WITH_5)
    start_and_abandon(launch, launch.checkpoint_dir / "ready")
    leader = int(recorded(launch, 0, "pid")["pid"])
    assert not gone(leader)

    second = LocalExecutor()
    second.set_callbacks(rec.on_exit, rec.on_ack)
    try:
        assert second.adopt(launch) is True
        assert second.running() == [("job-1", 1)]
        seen_at, ev = rec.exit()
        assert ev == AttemptExit("job-1", 1, False, (5,), False)
        assert seen_at - recorded(launch, 0, "exit")["ended_unix"] < 0.5
    finally:
        second.close(kill=True)


def test_adopted_attempt_can_be_stopped(tmp_path: Path, rec: Recorder) -> None:
    launch = make_launch(tmp_path, command=("sleep", "30"))
    start_and_abandon(launch, pid_file(launch.attempt_dir, 0))
    second = LocalExecutor()
    second.set_callbacks(rec.on_exit, rec.on_ack)
    try:
        assert second.adopt(launch)
        second.stop("job-1", 1, grace_s=2.0)
        _, ev = rec.exit()
        assert ev == AttemptExit("job-1", 1, False, (-signal.SIGTERM,), True)
    finally:
        second.close(kill=True)


def test_adopt_a_finished_attempt_reports_the_exit_record(tmp_path: Path) -> None:
    first_rec, second_rec = Recorder(), Recorder()
    first = LocalExecutor()
    first.set_callbacks(first_rec.on_exit, first_rec.on_ack)
    launch = make_launch(tmp_path, "import sys; sys.exit(4)")
    first.start(launch)
    assert first_rec.exit()[1].codes == (4,)
    first.close()

    second = LocalExecutor()
    second.set_callbacks(second_rec.on_exit, second_rec.on_ack)
    try:
        assert second.adopt(launch) is False
        _, ev = second_rec.exit()
        assert ev == AttemptExit("job-1", 1, False, (4,), False)
        assert second.running() == []
    finally:
        second.close(kill=True)


def test_adopt_guards_against_pid_reuse_and_missing_records(
    tmp_path: Path, ex: LocalExecutor, rec: Recorder
) -> None:
    members = (Member(0, "n", ()), Member(1, "n", ()), Member(2, "n", ()))
    launch = make_launch(tmp_path, command=("true",), members=members)
    adir = launch.attempt_dir
    adir.mkdir(parents=True)
    records_dir(adir).mkdir()
    exit_file(adir, 0).write_text(json.dumps({"code": 0, "ended_unix": time.time()}))
    # rank 1: no record at all; rank 2: its pid is now someone else (this test process)
    pid_file(adir, 2).write_text(json.dumps({"pid": os.getpid(), "start_time": 1}))
    assert ex.adopt(launch) is False
    _, ev = rec.exit()
    assert ev == AttemptExit("job-1", 1, False, (0, None, None), False)


def test_start_refuses_an_attempt_dir_with_a_live_member(tmp_path: Path, rec: Recorder) -> None:
    launch = make_launch(tmp_path, command=("sleep", "30"))
    start_and_abandon(launch, pid_file(launch.attempt_dir, 0))
    second = LocalExecutor()
    try:
        with pytest.raises(LaunchError, match="adopt"):
            second.start(launch)
        assert second.adopt(launch)
    finally:
        second.close(kill=True)


# ---------------------------------------------------------------------- issue 11, cases 3 and 5
def test_adopt_kills_what_a_dead_launcher_left_running(tmp_path: Path, rec: Recorder) -> None:
    """The OOM killer (or an operator) killed the member's supervisor and its launcher while
    the control plane was down: its command, reparented, keeps the member's process group and
    its GPU, and how it ends can no longer be known. Adoption must kill the whole group before
    the attempt is reported gone (and the job requeued)."""
    launch = make_launch(tmp_path, command=("sleep", "30"))
    start_and_abandon(launch, started_file(launch.attempt_dir, 0))
    supervisor = int(recorded(launch, 0, "pid")["pid"])
    launcher = int(recorded(launch, 0, "started")["launcher"])
    command = int(recorded(launch, 0, "started")["pid"])
    os.kill(supervisor, signal.SIGKILL)
    until(lambda: gone(supervisor), 5, "supervisor gone")
    os.kill(launcher, signal.SIGKILL)
    until(lambda: gone(launcher), 5, "launcher gone")
    assert not gone(command), "the command outlives its launcher"
    second = LocalExecutor()
    second.set_callbacks(rec.on_exit, rec.on_ack)
    try:
        assert second.adopt(launch) is False
        assert gone(command), "adopt returned while the old command still ran"
        _, ev = rec.exit()
        # lost: requeued; the command it left is counted with the strays killed
        assert ev == AttemptExit("job-1", 1, False, (None,), False, strays_killed=1)
        end = recorded(launch, 0, "exit")
        assert end["code"] is None and end["ended_unix"] > 0  # closes the run's interval
    finally:
        second.close(kill=True)


def test_a_half_spawned_gang_is_stopped_and_reported_lost(tmp_path: Path, rec: Recorder) -> None:
    """The control plane died between the spawns of a gang's members: rank 0 runs, rank 1 was
    never started. Adoption stops rank 0 and reports the attempt lost (requeued as the next
    attempt), instead of adopting it and failing the job when the gang rule kills rank 0."""
    members = (Member(0, "n", ("0",)), Member(1, "n", ("1",)))
    launch = make_launch(tmp_path, command=("sleep", "30"), members=members)
    launch.attempt_dir.mkdir(parents=True)
    records_dir(launch.attempt_dir).mkdir()
    launch.checkpoint_dir.mkdir(parents=True)
    rank0 = spawn_member(
        sys.executable, launch.attempt_dir, 0, launch.command, dict(os.environ), set()
    )
    file_appears(started_file(launch.attempt_dir, 0))
    command = int(recorded(launch, 0, "started")["pid"])
    second = LocalExecutor()
    second.set_callbacks(rec.on_exit, rec.on_ack)
    try:
        assert second.adopt(launch) is False
        assert gone(command) and gone(rank0.pid)
        _, ev = rec.exit()
        assert ev.codes == (None, None) and not ev.succeeded
    finally:
        second.close(kill=True)
        rank0.popen.wait(5)  # type: ignore[union-attr]


# ---------------------------------------------------------------------------- issue 30, item 5
EXITS_0_LATER = """
    import os, time
    open(os.path.join(os.environ["GPUFENCE_CHECKPOINT_DIR"], "ready"), "w").close()
    while not os.path.exists(os.path.join(os.environ["GPUFENCE_CHECKPOINT_DIR"], "go")):
        time.sleep(0.02)
    with open(os.path.join(os.environ["GPUFENCE_CHECKPOINT_DIR"], "runs"), "a") as fh:
        print("end", file=fh)
"""


@pytest.mark.parametrize("victim", ["launcher", "supervisor"])
def test_a_job_that_completes_after_its_launcher_was_killed_is_done(
    tmp_path: Path, rec: Recorder, victim: str
) -> None:
    """The launcher (the job's parent) or the supervisor (the process rank-R.pid names) is
    killed while the control plane is down, then the job exits 0: the survivor records the
    exit, so the restarted plane finds the attempt done -- never lost and run again."""
    launch = make_launch(tmp_path, EXITS_0_LATER)
    start_and_abandon(launch, launch.checkpoint_dir / "ready")
    until(lambda: started_file(launch.attempt_dir, 0).exists(), 5, "started record")
    started = recorded(launch, 0, "started")
    pid = int(recorded(launch, 0, "pid")["pid"]) if victim == "supervisor" else started["launcher"]
    os.kill(int(pid), signal.SIGKILL)
    until(lambda: gone(int(pid)), 5, f"{victim} gone")
    assert not gone(int(started["pid"])), "the job outlives it"
    (launch.checkpoint_dir / "go").touch()
    until(lambda: gone(int(started["pid"])), 10, "the job ended")
    until(lambda: recorded(launch, 0, "exit").get("code") is not None, 10, "the exit record")
    assert recorded(launch, 0, "exit")["code"] == 0
    second = LocalExecutor()
    second.set_callbacks(rec.on_exit, rec.on_ack)
    try:
        assert second.adopt(launch) is False
        _, ev = rec.exit()
        assert ev.codes == (0,), ev
    finally:
        second.close(kill=True)
    assert (launch.checkpoint_dir / "runs").read_text() == "end\n"
