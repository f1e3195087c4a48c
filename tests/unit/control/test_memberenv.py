"""A job's environment: the allow-list of the executor's own, the run_as user's identity, the
job's variables, gpufence's; never a server secret."""

from __future__ import annotations

import pwd
from pathlib import Path

from gpufence.control.base.executor import GpuShare, Launch, Member, RunAs
from gpufence.control.base.memberenv import (
    DEFAULT_ENV_INHERIT,
    inherited_env,
    member_envs,
    mps_env,
)

SERVER_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/root",
    "USER": "root",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "LC_TIME": "en_GB.UTF-8",
    "TZ": "UTC",
    "TERM": "xterm",
    "GPUFENCE_ADMIN_TOKEN": "admin-secret-0123",
    "GPUFENCE_TOKEN": "tenant-secret-0123",
    "VISION_TOKEN": "vision-secret-0123",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "LD_PRELOAD": "/tmp/evil.so",
    "PYTHONPATH": "/srv/server-only",
    "TERMINFO": "/x",
}


def _launch(tmp_path: Path, run_as: RunAs | None = None) -> Launch:
    return Launch(
        job_id="j1",
        attempt=1,
        command=("true",),
        env={"MY_VAR": "mine", "PATH": "/opt/job/bin:/usr/bin"},
        members=(Member(0, "n0", ("3",)), Member(1, "n0", ("4",))),
        attempt_dir=tmp_path / "jobs" / "j1" / "attempt-1",
        checkpoint_dir=tmp_path / "jobs" / "j1" / "checkpoints",
        run_as=run_as,
    )


def test_only_the_allow_list_is_inherited() -> None:
    got = inherited_env(SERVER_ENV)
    assert set(got) == {"PATH", "HOME", "USER", "LANG", "LC_ALL", "LC_TIME", "TZ", "TERM"}
    assert DEFAULT_ENV_INHERIT == ("PATH", "HOME", "USER", "LANG", "LC_*", "TZ", "TERM")
    # an extension by prefix still never lets GPUFENCE_* through
    assert inherited_env(SERVER_ENV, ["GPU*", "AWS_*"]) == {"AWS_SECRET_ACCESS_KEY": "aws-secret"}


def test_member_env_has_no_secret_and_the_run_as_identity(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    run_as = RunAs("nobody", nobody.pw_uid, nobody.pw_gid)
    envs = member_envs(_launch(tmp_path, run_as), "127.0.0.1", 29500, inherit=SERVER_ENV)
    assert set(envs) == {0, 1}
    env = envs[1]
    secrets = {v for k, v in SERVER_ENV.items() if "SECRET" in k or "TOKEN" in k}
    assert not secrets & set(env.values())
    assert not {"LD_PRELOAD", "PYTHONPATH", "TERMINFO", "VISION_TOKEN"} & set(env)
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == (nobody.pw_dir, "nobody", "nobody")
    assert env["PATH"] == "/opt/job/bin:/usr/bin", "the job's own --env wins over inherited"
    assert env["MY_VAR"] == "mine"
    assert (env["CUDA_VISIBLE_DEVICES"], env["RANK"], env["LOCAL_RANK"]) == ("4", "1", "1")
    gpufence = {k for k in env if k.startswith("GPUFENCE_")}
    assert gpufence == {
        "GPUFENCE_JOB_ID",
        "GPUFENCE_ATTEMPT",
        "GPUFENCE_CHECKPOINT_DIR",
        "GPUFENCE_NOTICE_FILE",
        "GPUFENCE_ACK_FILE",
        "GPUFENCE_WORLD_SIZE",
        "GPUFENCE_RANK",
        "GPUFENCE_NODE",
    }


def test_without_run_as_the_executor_identity_is_kept(tmp_path: Path) -> None:
    env = member_envs(_launch(tmp_path), "h", 1, inherit=SERVER_ENV)[0]
    assert (env["HOME"], env["USER"]) == ("/root", "root")
    assert "LOGNAME" not in env
    assert member_envs(_launch(tmp_path), "h", 1)[0]["MY_VAR"] == "mine"


def test_a_share_under_mps_gets_its_pipe_and_limits(tmp_path: Path) -> None:
    share = GpuShare(milli=250, mem_mib=10240, mps_pipe_dir="/data/mps/gpu-3/pipe")
    launch = Launch(
        job_id="j2",
        attempt=1,
        command=("true",),
        env={"CUDA_MPS_PIPE_DIRECTORY": "/tmp/escape", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"},
        members=(Member(0, "n0", ("GPU-x",), share), Member(1, "n0", ("GPU-y",))),
        attempt_dir=tmp_path / "a",
        checkpoint_dir=tmp_path / "c",
    )
    envs = member_envs(launch, "127.0.0.1", 29500, inherit=SERVER_ENV)
    mine = {k: v for k, v in envs[0].items() if k.startswith("CUDA_")}
    assert mine == {
        "CUDA_VISIBLE_DEVICES": "GPU-x",
        "CUDA_MPS_PIPE_DIRECTORY": "/data/mps/gpu-3/pipe",  # the job's own --env does not win
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
    }
    assert envs[1]["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/escape"  # no share: its own business


def test_mps_percentages_round_up_and_no_daemon_means_no_variables() -> None:
    assert mps_env(GpuShare(1, 0, "/p"))["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"
    assert mps_env(GpuShare(333, 0, "/p")) == {
        "CUDA_MPS_PIPE_DIRECTORY": "/p",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "34",
    }
    assert mps_env(GpuShare(500, 4096, None)) == {}
    assert mps_env(None) == {}
