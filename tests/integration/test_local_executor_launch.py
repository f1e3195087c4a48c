"""LocalExecutor launches: environment, devices, gang ranks, exit codes, launch errors, activity.

Every test runs real subprocesses in ``tmp_path`` with short sleeps; the file takes a few seconds.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
from executor_helpers import Recorder, make_launch, recorded

from gpufence.control.base.executor import AttemptExit, LaunchError, Member
from gpufence.control.executors.local.local_executor import LocalExecutor

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
    assert ev == AttemptExit("envjob", 2, True, (0,), False, stop_reached=False)
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
    reached = False if code == 0 else None  # the launcher's record, read for exit 0 only
    assert ev == AttemptExit("job-1", 1, code == 0, (code,), False, stop_reached=reached)
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
