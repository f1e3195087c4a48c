"""LocalExecutor against real processes: env, gangs, exits, stop/kill, notice/ack, adoption.

Every test runs real subprocesses in ``tmp_path`` with short sleeps; the file takes a few seconds.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufence.control.executors import AttemptExit, Launch, LaunchError, Member
from gpufence.control.executors.local import LocalExecutor

PY = sys.executable


class Recorder:
    """Collects callbacks (they arrive on the executor's watcher thread)."""

    def __init__(self) -> None:
        self.exits: queue.Queue[tuple[float, AttemptExit]] = queue.Queue()
        self.acks: queue.Queue[tuple[float, str, int]] = queue.Queue()

    def on_exit(self, ev: AttemptExit) -> None:
        self.exits.put((time.time(), ev))

    def on_ack(self, job_id: str, attempt: int) -> None:
        self.acks.put((time.time(), job_id, attempt))

    def exit(self, timeout: float = 5.0) -> tuple[float, AttemptExit]:
        return self.exits.get(timeout=timeout)


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


@pytest.fixture
def ex(rec: Recorder) -> Iterator[LocalExecutor]:
    executor = LocalExecutor()
    executor.set_callbacks(rec.on_exit, rec.on_ack)
    yield executor
    executor.close(kill=True)


def make_launch(
    root: Path,
    script: str | None = None,
    *,
    command: tuple[str, ...] | None = None,
    job: str = "job-1",
    attempt: int = 1,
    members: tuple[Member, ...] = (Member(0, "node-a", ("0",)),),
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Launch:
    if command is None:
        assert script is not None
        command = (PY, "-c", textwrap.dedent(script))
    jdir = root / "jobs" / job
    return Launch(
        job_id=job,
        attempt=attempt,
        command=command,
        env=env or {},
        members=members,
        attempt_dir=jdir / f"attempt-{attempt}",
        checkpoint_dir=jdir / "checkpoints",
        cwd=cwd,
    )


def wait_for(path: Path, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def gone(pid: int) -> bool:
    """Not running: no /proc entry, or a zombie waiting for a reaper."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return data[data.rfind(b")") + 2 :].split()[0] in (b"Z", b"X")


def group_alive(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            data = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            out.append(int(name))
    return out


def group_gone(pgid: int, timeout: float = 1.0) -> bool:
    """SIGKILL is delivered asynchronously: give the group's stragglers a moment to die."""
    deadline = time.monotonic() + timeout
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def recorded(launch: Launch, rank: int, kind: str) -> dict[str, float]:
    data: dict[str, float] = json.loads((launch.attempt_dir / f"rank-{rank}.{kind}").read_text())
    return data


ENV_KEYS = (
    "CUDA_VISIBLE_DEVICES",
    "GPUFENCE_JOB_ID",
    "GPUFENCE_ATTEMPT",
    "GPUFENCE_CHECKPOINT_DIR",
    "GPUFENCE_NOTICE_FILE",
    "GPUFENCE_ACK_FILE",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GPUFENCE_RANK",
    "GPUFENCE_WORLD_SIZE",
    "USER_TOKEN",
)

DUMP_ENV = f"""
    import json, os
    keys = {ENV_KEYS!r}
    env = {{k: os.environ.get(k) for k in keys}}
    env["cwd"] = os.getcwd()
    path = os.path.join(os.environ["GPUFENCE_CHECKPOINT_DIR"], "env-" + os.environ["RANK"])
    with open(path, "w") as fh:
        json.dump(env, fh)
"""


def test_environment_devices_and_cwd(
    tmp_path: Path, ex: LocalExecutor, rec: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpufence.executor")
    work = tmp_path / "work"
    work.mkdir()
    launch = make_launch(
        tmp_path,
        DUMP_ENV,
        job="envjob",
        attempt=2,
        members=(Member(0, "node-a", ("0", "3")),),
        # the executor's variables win over user ones that would break isolation
        env={"USER_TOKEN": "s3cret-value", "CUDA_VISIBLE_DEVICES": "7", "RANK": "9"},
        cwd=work,
    )
    ex.start(launch)
    _, ev = rec.exit()
    assert ev == AttemptExit("envjob", 2, True, (0,), False)
    env = json.loads((launch.checkpoint_dir / "env-0").read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == "0,3"
    assert env["GPUFENCE_JOB_ID"] == "envjob"
    assert env["GPUFENCE_ATTEMPT"] == "2"
    assert Path(env["GPUFENCE_CHECKPOINT_DIR"]) == launch.checkpoint_dir
    assert Path(env["GPUFENCE_NOTICE_FILE"]) == launch.attempt_dir / "notice"
    assert Path(env["GPUFENCE_ACK_FILE"]) == launch.attempt_dir / "ack"
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("0", "1", "0")
    assert (env["GPUFENCE_RANK"], env["GPUFENCE_WORLD_SIZE"]) == ("0", "1")
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert 0 < int(env["MASTER_PORT"]) < 65536
    assert env["USER_TOKEN"] == "s3cret-value"
    assert Path(env["cwd"]) == work
    assert "s3cret-value" not in caplog.text  # environment values are never logged
    assert ex.running() == []


def test_cpu_only_member_sees_no_gpu(tmp_path: Path, ex: LocalExecutor, rec: Recorder) -> None:
    launch = make_launch(tmp_path, DUMP_ENV, members=(Member(0, "node-a", ()),))
    ex.start(launch)
    assert rec.exit()[1].succeeded
    env = json.loads((launch.checkpoint_dir / "env-0").read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_gang_ranks_world_size_and_local_rank(
    tmp_path: Path, ex: LocalExecutor, rec: Recorder
) -> None:
    members = (
        Member(0, "node-a", ("0",)),
        Member(1, "node-a", ("1",)),
        Member(2, "node-b", ("MIG-2b7d1a4e-0000-0000-0000-000000000000",)),
    )
    launch = make_launch(tmp_path, DUMP_ENV, members=members)
    ex.start(launch)
    _, ev = rec.exit()
    assert ev.succeeded and ev.codes == (0, 0, 0)
    envs = [json.loads((launch.checkpoint_dir / f"env-{r}").read_text()) for r in range(3)]
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert [e["GPUFENCE_RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", members[2].devices[0]]
    assert len({e["MASTER_PORT"] for e in envs}) == 1  # one rendezvous port per attempt


def test_two_member_gang(tmp_path: Path, ex: LocalExecutor, rec: Recorder) -> None:
    members = (Member(0, "n", ("0",)), Member(1, "n", ("1",)))
    launch = make_launch(tmp_path, DUMP_ENV, members=members)
    ex.start(launch)
    assert rec.exit()[1].codes == (0, 0)
    envs = [json.loads((launch.checkpoint_dir / f"env-{r}").read_text()) for r in range(2)]
    assert [(e["RANK"], e["WORLD_SIZE"]) for e in envs] == [("0", "2"), ("1", "2")]


def test_user_command_starts_with_default_signal_state(
    tmp_path: Path, ex: LocalExecutor, rec: Recorder
) -> None:
    # the launcher blocks/catches signals; none of that may leak into the user command
    launch = make_launch(
        tmp_path, command=("sh", "-c", "grep -E '^Sig(Blk|Ign):' /proc/self/status")
    )
    ex.start(launch)
    assert rec.exit()[1].succeeded
    out = (launch.attempt_dir / "rank-0.out").read_text()
    masks = dict(line.split(":\t") for line in out.splitlines())
    assert int(masks["SigBlk"], 16) == 0
    assert int(masks["SigIgn"], 16) == 0


@pytest.mark.parametrize("code", [0, 3])
def test_exit_code_and_prompt_on_exit(
    tmp_path: Path, ex: LocalExecutor, rec: Recorder, code: int
) -> None:
    script = f"""
        import sys, time
        print("hello out"); print("hello err", file=sys.stderr)
        time.sleep(0.2)
        sys.exit({code})
    """
    launch = make_launch(tmp_path, script)
    ex.start(launch)
    assert ex.running() == [("job-1", 1)]
    seen_at, ev = rec.exit()
    assert ev == AttemptExit("job-1", 1, code == 0, (code,), False)
    ended = recorded(launch, 0, "exit")
    assert ended["code"] == code
    assert 0 <= seen_at - ended["ended_unix"] < 0.5
    assert (launch.attempt_dir / "rank-0.out").read_text() == "hello out\n"
    assert "hello err" in (launch.attempt_dir / "rank-0.err").read_text()
    pid = recorded(launch, 0, "pid")
    assert pid["pid"] > 0 and pid["start_time"] > 0
    assert ex.running() == []


def test_command_not_found_is_127(tmp_path: Path, ex: LocalExecutor, rec: Recorder) -> None:
    launch = make_launch(tmp_path, command=("gpufence-no-such-command-xyz", "--flag"))
    ex.start(launch)
    _, ev = rec.exit()
    assert ev.codes == (127,) and not ev.succeeded
    assert "command not found" in (launch.attempt_dir / "rank-0.err").read_text()


def test_command_not_executable_is_126(tmp_path: Path, ex: LocalExecutor, rec: Recorder) -> None:
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    launch = make_launch(tmp_path, command=(str(script),))
    ex.start(launch)
    assert rec.exit()[1].codes == (126,)


IGNORES_TERM_WITH_GRANDCHILD = """
    import os, signal, subprocess, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", "30"])  # inherits the ignored SIGTERM
    ready = os.path.join(os.environ["GPUFENCE_CHECKPOINT_DIR"], "ready")
    with open(ready + ".tmp", "w") as fh:
        fh.write(str(child.pid))
    os.replace(ready + ".tmp", ready)
    time.sleep(30)
"""


def test_stop_sigkills_the_whole_group_after_grace(
    tmp_path: Path, ex: LocalExecutor, rec: Recorder
) -> None:
    launch = make_launch(tmp_path, IGNORES_TERM_WITH_GRANDCHILD)
    ex.start(launch)
    ready = launch.checkpoint_dir / "ready"
    wait_for(ready)
    grandchild = int(ready.read_text())
    leader = int(recorded(launch, 0, "pid")["pid"])
    assert len(group_alive(leader)) == 3  # launcher, command, grandchild
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
        wait_for(launch.checkpoint_dir / "ready")
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
    wait_for(launch.checkpoint_dir / "ready")
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


ENDS_WITH_5 = """
    import os, sys, time
    open(os.path.join(os.environ["GPUFENCE_CHECKPOINT_DIR"], "ready"), "w").close()
    time.sleep(0.8)
    sys.exit(5)
"""


def test_adopt_a_running_attempt_after_restart(tmp_path: Path, rec: Recorder) -> None:
    first = LocalExecutor()
    launch = make_launch(tmp_path, ENDS_WITH_5)
    first.start(launch)
    wait_for(launch.checkpoint_dir / "ready")
    first.close(kill=False)  # the control plane goes away; the job keeps running
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
    first = LocalExecutor()
    launch = make_launch(tmp_path, command=("sleep", "30"))
    first.start(launch)
    wait_for(launch.attempt_dir / "rank-0.pid")
    first.close(kill=False)
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
    (adir / "rank-0.exit").write_text(json.dumps({"code": 0, "ended_unix": time.time()}))
    # rank 1: no record at all; rank 2: its pid is now someone else (this test process)
    (adir / "rank-2.pid").write_text(json.dumps({"pid": os.getpid(), "start_time": 1}))
    assert ex.adopt(launch) is False
    _, ev = rec.exit()
    assert ev == AttemptExit("job-1", 1, False, (0, None, None), False)


def test_launch_errors(tmp_path: Path, ex: LocalExecutor, rec: Recorder) -> None:
    launch = make_launch(tmp_path, command=("sleep", "30"))
    ex.start(launch)
    with pytest.raises(LaunchError, match="running"):
        ex.start(launch)
    with pytest.raises(LaunchError, match="working directory"):
        ex.start(make_launch(tmp_path, command=("true",), job="j2", cwd=tmp_path / "missing"))
    with pytest.raises(LaunchError, match="ranks"):
        ex.start(make_launch(tmp_path, command=("true",), job="j3", members=(Member(1, "n", ()),)))
    with pytest.raises(LaunchError, match="empty command"):
        ex.start(make_launch(tmp_path, command=(), job="j4"))
    assert ex.running() == [("job-1", 1)]
    ex.stop("job-1", 1, grace_s=1.0)
    assert rec.exit()[1].stopped
    ex.close()
    with pytest.raises(LaunchError, match="closed"):
        ex.start(make_launch(tmp_path, command=("true",), job="j5"))


def test_start_refuses_an_attempt_dir_with_a_live_member(tmp_path: Path, rec: Recorder) -> None:
    first = LocalExecutor()
    launch = make_launch(tmp_path, command=("sleep", "30"))
    first.start(launch)
    wait_for(launch.attempt_dir / "rank-0.pid")
    first.close(kill=False)
    second = LocalExecutor()
    try:
        with pytest.raises(LaunchError, match="adopt"):
            second.start(launch)
        assert second.adopt(launch)
    finally:
        second.close(kill=True)


def test_activity_tells_busy_from_idle(tmp_path: Path, ex: LocalExecutor, rec: Recorder) -> None:
    spin = "import time\nend = time.time() + 5\nwhile time.time() < end: pass"
    busy = make_launch(tmp_path, spin)
    idle = make_launch(tmp_path, command=("sleep", "5"), job="idle")
    ex.start(busy)
    ex.start(idle)
    time.sleep(0.1)
    ex.activity()  # baseline
    time.sleep(0.5)
    sample = ex.activity()
    assert set(sample) == {("job-1", 1), ("idle", 1)}
    assert sample[("job-1", 1)] > 0.1, sample  # ~1.0 on an idle machine
    assert sample[("idle", 1)] < 0.05, sample
    ex.stop("job-1", 1, 1.0)
    ex.stop("idle", 1, 1.0)
    assert {rec.exit()[1].job_id, rec.exit()[1].job_id} == {"job-1", "idle"}


def test_close_kill_leaves_nothing_running(tmp_path: Path, rec: Recorder) -> None:
    ex = LocalExecutor()
    ex.set_callbacks(rec.on_exit, rec.on_ack)
    launch = make_launch(tmp_path, IGNORES_TERM_WITH_GRANDCHILD)
    ex.start(launch)
    ready = launch.checkpoint_dir / "ready"
    wait_for(ready)
    leader = int(recorded(launch, 0, "pid")["pid"])
    ex.close(kill=True)
    ex.close(kill=True)  # idempotent
    assert group_gone(leader)
    assert gone(int(ready.read_text()))
    assert rec.exits.empty()  # no callbacks after close


def test_handoff_latency(tmp_path: Path, ex: LocalExecutor, rec: Recorder) -> None:
    """Exit of one attempt to the start of the next: the executor's share stays small."""
    lags = []
    for i in range(5):
        launch = make_launch(tmp_path, command=("true",), job=f"h{i}")
        ex.start(launch)
        seen_at, ev = rec.exit()
        assert ev.succeeded
        lags.append(seen_at - recorded(launch, 0, "exit")["ended_unix"])
    lags.sort()
    assert lags[len(lags) // 2] < 0.05
