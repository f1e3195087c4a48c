"""LocalExecutor stopping: stop/kill of whole process groups, notice/ack handshake, gang failure.

Every test runs real subprocesses in ``tmp_path`` with short sleeps; the file takes a few seconds.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from executor_helpers import (
    IGNORES_TERM_WITH_GRANDCHILD,
    Recorder,
    gone,
    group_alive,
    group_gone,
    make_launch,
    recorded,
)

from gpufence.control.base.executor import AttemptExit, Member
from gpufence.control.executors.local.local_executor import LocalExecutor
from gpufence.testing.waiting import file_appears


def test_stop_sigkills_the_whole_group_after_grace(
    tmp_path: Path, ex: LocalExecutor, rec: Recorder
) -> None:
    launch = make_launch(tmp_path, IGNORES_TERM_WITH_GRANDCHILD)
    ex.start(launch)
    ready = launch.checkpoint_dir / "ready"
    file_appears(ready)
    grandchild = int(ready.read_text())
    leader = int(recorded(launch, 0, "pid")["pid"])
    assert len(group_alive(leader)) == 4  # supervisor, launcher, command, grandchild
    t0 = time.monotonic()
    ex.stop("job-1", 1, grace_s=0.4)
    ex.stop("job-1", 1, grace_s=0.4)  # idempotent
    _, ev = rec.exit()
    took = time.monotonic() - t0
    assert ev == AttemptExit("job-1", 1, False, (-signal.SIGKILL,), True)
    assert 0.4 <= took < 1.5
    assert group_gone(leader)
    assert gone(grandchild)
    assert rec.exits.empty()


def test_stop_plain_process_ends_on_sigterm(
    tmp_path: Path, ex: LocalExecutor, rec: Recorder
) -> None:
    launch = make_launch(tmp_path, command=("sleep", "30"))
    ex.start(launch)
    # sent before the launcher can have installed its handlers: it must still reach the command
    ex.stop("job-1", 1, grace_s=5.0)
    t0 = time.monotonic()
    _, ev = rec.exit()
    assert time.monotonic() - t0 < 2.0
    assert ev == AttemptExit("job-1", 1, False, (-signal.SIGTERM,), True)


def test_an_exit_0_on_the_stops_sigterm_is_reported_as_reached_by_the_stop(
    tmp_path: Path, ex: LocalExecutor, rec: Recorder
) -> None:
    """A graceful exit on SIGTERM: every member at 0, but the stop reached it (its launcher's
    record says so), so the control plane requeues it rather than calling it done."""
    script = """
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        open(os.path.join(os.environ["GPUFENCE_CHECKPOINT_DIR"], "ready"), "w").close()
        time.sleep(30)
    """
    launch = make_launch(tmp_path, script)
    ex.start(launch)
    file_appears(launch.checkpoint_dir / "ready")
    ex.stop("job-1", 1, grace_s=5.0)
    _, ev = rec.exit()
    assert ev == AttemptExit("job-1", 1, True, (0,), True, stop_reached=True)


def test_with_sigterm_as_the_notice_the_records_tell_no_stop(tmp_path: Path, rec: Recorder) -> None:
    """A notice sent as SIGTERM looks like a stop to the launcher: its record then tells
    nothing (None), and the control plane goes by whether it had asked the stop."""
    ex = LocalExecutor(notice_signal=signal.SIGTERM)
    ex.set_callbacks(rec.on_exit, rec.on_ack)
    try:
        ex.start(make_launch(tmp_path, command=("true",)))
        _, ev = rec.exit()
        assert ev == AttemptExit("job-1", 1, True, (0,), False, stop_reached=None)
    finally:
        ex.close(kill=True)


def test_stop_of_unknown_attempt_is_a_no_op(ex: LocalExecutor, rec: Recorder) -> None:
    ex.stop("nope", 1, grace_s=0.1)
    ex.notice("nope", 1, "preempt", time.time() + 10)
    assert rec.exits.empty()


ACKS_NOTICE = """
    import json, os, signal, sys, time
    def on_notice(signum, frame):
        with open(os.environ["GPUFENCE_NOTICE_FILE"]) as fh:
            notice = json.load(fh)
        ack = os.environ["GPUFENCE_ACK_FILE"]
        with open(ack + ".tmp", "w") as fh:  # the ack counts once the file exists
            json.dump({"signal": signum, **notice}, fh)
        os.replace(ack + ".tmp", ack)
        time.sleep(0.1)  # "checkpoint"
        sys.exit(0)
    signal.signal(signal.SIGUSR1, on_notice)
    signal.signal(signal.SIGUSR2, on_notice)
    open(os.path.join(os.environ["GPUFENCE_CHECKPOINT_DIR"], "ready"), "w").close()
    time.sleep(30)
"""


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2])
def test_notice_then_ack(tmp_path: Path, rec: Recorder, sig: signal.Signals) -> None:
    ex = LocalExecutor(notice_signal=sig)
    ex.set_callbacks(rec.on_exit, rec.on_ack)
    try:
        launch = make_launch(tmp_path, ACKS_NOTICE)
        ex.start(launch)
        file_appears(launch.checkpoint_dir / "ready")
        deadline = time.time() + 30
        t0 = time.time()
        ex.notice("job-1", 1, "preempted by job-9", deadline)
        acked_at, job, attempt = rec.acks.get(timeout=5)
        assert (job, attempt) == ("job-1", 1)
        assert acked_at - t0 < 1.0
        notice = json.loads((launch.attempt_dir / "notice").read_text())
        assert notice == {"reason": "preempted by job-9", "deadline_unix": deadline}
        ack = json.loads((launch.attempt_dir / "ack").read_text())
        assert ack["signal"] == sig and ack["reason"] == "preempted by job-9"
        exited_at, ev = rec.exit()
        assert ev.succeeded and not ev.stopped
        assert ev.stop_reached is False  # the notice's signal is not a stop
        assert exited_at >= acked_at
        assert rec.acks.empty()  # once
    finally:
        ex.close(kill=True)


def test_ack_written_just_before_exit_still_reported(
    tmp_path: Path, ex: LocalExecutor, rec: Recorder
) -> None:
    script = """
        import os, signal, sys, time
        def on_notice(signum, frame):
            open(os.environ["GPUFENCE_ACK_FILE"], "w").close()
            sys.exit(0)
        signal.signal(signal.SIGUSR1, on_notice)
        open(os.path.join(os.environ["GPUFENCE_CHECKPOINT_DIR"], "ready"), "w").close()
        time.sleep(30)
    """
    launch = make_launch(tmp_path, script)
    ex.start(launch)
    file_appears(launch.checkpoint_dir / "ready")
    ex.notice("job-1", 1, "drain", time.time() + 5)
    _, job, _ = rec.acks.get(timeout=5)
    assert job == "job-1"
    assert rec.exit()[1].succeeded


def test_gang_member_failure_stops_the_others(
    tmp_path: Path, ex: LocalExecutor, rec: Recorder
) -> None:
    script = """
        import os, sys, time
        if os.environ["RANK"] == "1":
            time.sleep(0.2)
            sys.exit(2)
        time.sleep(30)
    """
    members = (Member(0, "n", ("0",)), Member(1, "n", ("1",)))
    launch = make_launch(tmp_path, script, members=members)
    t0 = time.monotonic()
    ex.start(launch)
    _, ev = rec.exit()
    assert time.monotonic() - t0 < 2.0
    assert ev == AttemptExit("job-1", 1, False, (-signal.SIGTERM, 2), False)


def test_gang_failure_sigkills_a_member_that_ignores_sigterm(tmp_path: Path, rec: Recorder) -> None:
    ex = LocalExecutor(gang_grace_s=0.3)
    ex.set_callbacks(rec.on_exit, rec.on_ack)
    script = """
        import os, signal, sys, time
        ready = os.path.join(os.environ["GPUFENCE_CHECKPOINT_DIR"], "ready")
        if os.environ["RANK"] == "0":
            while not os.path.exists(ready):
                time.sleep(0.01)
            sys.exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(ready, "w").close()
        time.sleep(30)
    """
    try:
        launch = make_launch(tmp_path, script, members=(Member(0, "n", ()), Member(1, "n", ())))
        ex.start(launch)
        _, ev = rec.exit()
        assert ev == AttemptExit("job-1", 1, False, (1, -signal.SIGKILL), False)
    finally:
        ex.close(kill=True)


def test_close_kill_leaves_nothing_running(tmp_path: Path, rec: Recorder) -> None:
    ex = LocalExecutor()
    ex.set_callbacks(rec.on_exit, rec.on_ack)
    launch = make_launch(tmp_path, IGNORES_TERM_WITH_GRANDCHILD)
    ex.start(launch)
    ready = launch.checkpoint_dir / "ready"
    file_appears(ready)
    leader = int(recorded(launch, 0, "pid")["pid"])
    ex.close(kill=True)
    ex.close(kill=True)  # idempotent
    assert group_gone(leader)
    assert gone(int(ready.read_text()))
    assert rec.exits.empty()  # no callbacks after close
