"""The ``SLURM_*`` variables every job gets: job-wide ones from its submit (``launch_for``), and
per member its rank, rank on its node, node count and GPU indices (``member_envs``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufence.control.base.config import ControlConfig
from gpufence.control.base.executor import Launch, Member
from gpufence.control.base.jobspec import ArrayTask, SubmitRequest
from gpufence.control.base.memberenv import member_envs
from gpufence.control.reconciler.launches import launch_for
from gpufence.model.job import WorkloadClass
from gpufence.model.partition import Partition


def _req(**fields: Any) -> SubmitRequest:
    return SubmitRequest.model_validate({"command": ["/bin/sh", "/w/run.sh"], **fields})


def _slurm(env: dict[str, str] | Any) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("SLURM_")}


def test_an_array_task_gets_the_job_and_array_variables(tmp_path: Path) -> None:
    spec = _req(
        name="sweep",
        cwd="/w",
        cpus=4,
        replicas=2,
        array="1-9:2%2",
        array_task=ArrayTask(job="j4", index=5, cap=2),
    )
    part = Partition("batch", frozenset(WorkloadClass))
    launch = launch_for(ControlConfig(), tmp_path, "j7", 1, "t", spec, [], part)
    assert _slurm(launch.env) == {
        "SLURM_JOB_ID": "j7",
        "SLURM_JOBID": "j7",
        "SLURM_JOB_NAME": "sweep",
        "SLURM_NTASKS": "2",
        "SLURM_NPROCS": "2",
        "SLURM_JOB_PARTITION": "batch",
        "SLURM_SUBMIT_DIR": "/w",
        "SLURM_CPUS_PER_TASK": "4",
        "SLURM_ARRAY_JOB_ID": "j4",
        "SLURM_ARRAY_TASK_ID": "5",
        "SLURM_ARRAY_TASK_MIN": "1",
        "SLURM_ARRAY_TASK_MAX": "9",
        "SLURM_ARRAY_TASK_COUNT": "5",
    }
    # the GPUFENCE_* twins agree
    assert launch.env["GPUFENCE_ARRAY_TASK_ID"] == "5"
    assert launch.env["GPUFENCE_ARRAY_JOB_ID"] == "j4"


def test_a_plain_job_is_named_by_its_submit_or_its_program(tmp_path: Path) -> None:
    def env(spec: SubmitRequest) -> dict[str, str]:
        return _slurm(launch_for(ControlConfig(), tmp_path, "j9", 1, "t", spec, []).env)

    plain = env(_req(cpus=1.5, partition="p"))
    assert plain == {
        "SLURM_JOB_ID": "j9",
        "SLURM_JOBID": "j9",
        "SLURM_JOB_NAME": "sh",  # no --name, no script name: the program's base name
        "SLURM_NTASKS": "1",
        "SLURM_NPROCS": "1",
        "SLURM_JOB_PARTITION": "p",  # not placed yet (adopted): the one it asked for
    }  # no SLURM_CPUS_PER_TASK for 1.5 cores: Slurm's is a whole number
    named = env(_req(env={"SLURM_JOB_NAME": "run.sh", "SLURM_JOB_ID": "forged"}))
    assert named["SLURM_JOB_NAME"] == "run.sh"  # the script's name, as the CLI puts it
    assert named["SLURM_JOB_ID"] == "j9"  # gpufence's own win over the job's --env


def test_each_member_gets_its_rank_and_gpus(tmp_path: Path) -> None:
    launch = Launch(
        job_id="j1",
        attempt=1,
        command=("true",),
        env={},
        members=(
            Member(0, "n0", ("3",)),
            Member(1, "n0", ("4", "5")),
            Member(2, "n1", ("MIG-1234",)),
            Member(3, "n1", ()),
        ),
        attempt_dir=tmp_path / "a",
        checkpoint_dir=tmp_path / "c",
    )
    envs = member_envs(launch, "127.0.0.1", 29500)
    got = {r: _slurm(e) for r, e in envs.items()}
    nodes = {"SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2"}
    assert got == {
        0: {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", **nodes, "SLURM_JOB_GPUS": "3"},
        1: {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", **nodes, "SLURM_JOB_GPUS": "4,5"},
        2: {"SLURM_PROCID": "2", "SLURM_LOCALID": "0", **nodes},  # a MIG UUID is no index
        3: {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", **nodes},  # no GPU
    }
