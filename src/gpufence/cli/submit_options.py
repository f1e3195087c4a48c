"""The options of ``gpufence submit``, declared once: ``submit_verb.submit``'s signature names
them, and a verb whose option means the same and reads the same (``run --pty``'s ``--cwd``)
uses the same declaration, so the help of the two cannot drift apart.

A name ``XOpt`` is ``Annotated[type, typer.Option(...)]``; the verb gives the default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufence.cli.jobfile import DIRECTIVE
from gpufence.cli.jobrefs import WAIT_CODES

CommandArg = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="CMD",
        help="the command to run, after --: -- python train.py --lr 3e-4; or one script "
        f"whose '{DIRECTIVE} --gpus 2 ...' (or '#SBATCH --gres=gpu:2 ...') lines at its "
        "top give options",
        show_default=False,
    ),
]
FileOpt = Annotated[
    Path | None,
    typer.Option(
        "--file",
        "-f",
        metavar="JOBS.yaml",
        help="submit the jobs of a job file (apiVersion: gpufence/v1, kind: Job; several "
        "documents allowed; README 'Job files, scripts, arrays and dependencies')",
        show_default=False,
    ),
]
GpusOpt = Annotated[
    int | None,
    typer.Option(
        "--gpus",
        metavar="N",
        min=0,
        help="whole GPUs per replica; 0: a CPU-only step (one core unless --cpus)",
    ),
]
MigOpt = Annotated[
    str | None,
    typer.Option("--mig", metavar="PROFILE", help="one MIG instance per replica, e.g. 1g.10gb"),
]
GpuFractionOpt = Annotated[
    float | None,
    typer.Option("--gpu-fraction", metavar="F", help="a share of one GPU, 0 < F < 1"),
]
GpuMemOpt = Annotated[
    float | None,
    typer.Option("--gpu-mem", metavar="GIB", help="GiB of GPU memory with --gpu-fraction"),
]
ReplicasOpt = Annotated[
    int | None,
    typer.Option(
        "--replicas",
        metavar="R",
        help="gang size: R members placed together as one job (serving: see --instances)",
    ),
]
InstancesOpt = Annotated[
    int | None,
    typer.Option(
        "--instances",
        metavar="N",
        min=1,
        help="serving: a deployment of N replicas, each a job of its own sharing --name "
        "(scaled, placed and stopped one by one)",
    ),
]
PartitionOpt = Annotated[
    str | None,
    typer.Option(
        "--partition",
        metavar="NAME",
        help="partition (fence) to run in [default: one that admits its class]",
    ),
]
QueueOpt = Annotated[
    str | None,
    typer.Option("--queue", metavar="NAME", help="queue to wait in [default: the tenant's queue]"),
]
PriorityOpt = Annotated[
    int | None,
    typer.Option("--priority", metavar="P", help="higher runs first within its queue [default: 0]"),
]
CheckpointableOpt = Annotated[
    bool,
    typer.Option(
        "--checkpointable",
        help="it checkpoints on notice (may be preempted, lent capacity, requeued)",
    ),
]
EstRuntimeOpt = Annotated[
    float | None,
    typer.Option("--est-runtime", metavar="SECONDS", help="estimated runtime (s), for backfill"),
]
CpusOpt = Annotated[
    float | None,
    typer.Option(
        "--cpus",
        metavar="N",
        help="CPU cores per replica (placed, and the job is held to them)",
    ),
]
MemOpt = Annotated[
    str | None,
    typer.Option(
        "--mem",
        metavar="SIZE",
        help="host memory per replica, e.g. 8G (over it the job is OOM-killed)",
    ),
]
LogLimitOpt = Annotated[
    str | None,
    typer.Option(
        "--log-limit",
        metavar="SIZE",
        help="cap on each replica's stdout and stderr, e.g. 100M (past it the log keeps its "
        "start and newest output) [default: the partition's, which is also the most]",
    ),
]
TimeLimitOpt = Annotated[
    str | None,
    typer.Option(
        "--time-limit",
        metavar="DURATION",
        help="stop each attempt after this long, e.g. 90 (s), 30m, 2h, 1d, 01:30:00",
    ),
]
SloP99MsOpt = Annotated[
    float | None,
    typer.Option(
        "--slo-p99-ms", metavar="MS", help="serving: the p99 latency (ms) it serves users at"
    ),
]
MetricsUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--metrics-url",
        metavar="URL",
        help="serving: the replica's Prometheus endpoint; gpufence reads its latency "
        "histogram (*_request_duration_seconds) from it",
    ),
]
MetricsPortOpt = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        metavar="PORT",
        help="serving: as --metrics-url, http://<its node>:PORT/metrics",
    ),
]
LatencyMetricOpt = Annotated[
    str | None,
    typer.Option(
        "--latency-metric",
        metavar="NAME",
        help="serving: the histogram to read [default: any *_request_duration_seconds]",
    ),
]
EnvOpt = Annotated[
    list[str] | None,
    typer.Option("--env", metavar="KEY=VALUE", help="an environment variable (repeatable)"),
]
WorkloadClassOpt = Annotated[
    str | None,
    typer.Option(
        "--class",
        metavar="CLASS",
        help="training (default), serving, interactive or batch",
    ),
]
NameOpt = Annotated[
    str | None,
    typer.Option(
        "--name",
        metavar="NAME",
        help="a name for it, usable wherever its id is (unique among your jobs not ended)",
    ),
]
MaxAttemptsOpt = Annotated[
    int | None,
    typer.Option(
        "--max-attempts",
        metavar="N",
        help="runs at most N times (requeues after a lost node or restart) [default: 3]",
    ),
]
CwdOpt = Annotated[
    str | None,
    typer.Option("--cwd", metavar="DIR", help="working directory [default: the current one]"),
]
ContainerOpt = Annotated[
    str | None,
    typer.Option(
        "--container",
        metavar="IMAGE",
        help="run in this image, on the server: an Apptainer/Singularity .sif or a "
        "directory holding a root file system; the working directory is mounted in",
    ),
]
TenantOpt = Annotated[
    str | None,
    typer.Option("--tenant", metavar="NAME", help="admin only: submit on behalf of a tenant"),
]
ArrayOpt = Annotated[
    str | None,
    typer.Option(
        "--array",
        metavar="SPEC",
        help="one job per index: 0-99, 1,3,5-7, 0-20:2; %N caps how many run at once "
        "(0-99%8); each gets GPUFENCE_ARRAY_TASK_ID and GPUFENCE_ARRAY_JOB_ID",
    ),
]
AfterOkOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--after-ok",
        metavar="JOB[,JOB]",
        help="start after these jobs (ids or names) succeeded; cancelled if one fails",
    ),
]
AfterAnyOpt = Annotated[
    list[str] | None,
    typer.Option("--after-any", metavar="JOB[,JOB]", help="start after these jobs ended, however"),
]
AfterNotOkOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--after-not-ok",
        metavar="JOB[,JOB]",
        help="start after these jobs ended without success; cancelled if one succeeds",
    ),
]
HoldOpt = Annotated[
    bool, typer.Option("--hold", help="submit on hold: pending until 'gpufence release'")
]
WaitOpt = Annotated[
    bool,
    typer.Option("--wait", help="wait until the job ends and exit with its code: " + WAIT_CODES),
]
IdempotencyKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--idempotency-key",
        metavar="KEY",
        help="submitting again with the same KEY returns the job made the first time, "
        "never a second one [default: a fresh one per submit, reused by its retries]",
        show_default=False,
    ),
]
