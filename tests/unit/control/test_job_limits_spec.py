"""``--cpus`` / ``--mem`` / ``--time-limit``: the API fields, their validation (errors name the
field), the CLI's units, and the core ``Job`` and ``Launch.limits`` they become."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gpufence.cli.units import format_duration, format_size, parse_duration, parse_size
from gpufence.control.base.config import ControlConfig
from gpufence.control.base.executor import Limits, Member, RunAs
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.reconciler.launches import launch_for
from gpufence.model.job import WorkloadClass
from gpufence.model.partition import Partition

GIB = 1 << 30


def _req(**fields: Any) -> SubmitRequest:
    return SubmitRequest.model_validate({"command": ["true"], **fields})


def test_fields_become_the_core_job() -> None:
    job = _req(cpus=2.5, mem_bytes=3 * GIB + 1, time_limit_s=90).to_job("j1", 0.0, "")
    assert job.cpu_milli == 2500
    assert job.mem_mib == 3 * 1024 + 1, "rounded up: never less than asked"
    assert job.time_limit_s == 90
    plain = _req().to_job("j2", 0.0, "")
    assert (plain.cpu_milli, plain.mem_mib, plain.time_limit_s) == (0, 0, None)


@pytest.mark.parametrize(
    ("fields", "loc", "text"),
    [
        ({"cpus": 0}, "cpus", "greater than or equal to 0.001"),
        ({"cpus": -1}, "cpus", "greater than or equal"),
        ({"cpus": "two"}, "cpus", "must be a number, not the string"),
        ({"mem_bytes": 1000}, "mem_bytes", "greater than or equal to 1048576"),
        ({"mem_bytes": "4G"}, "mem_bytes", "must be a number, not the string"),
        ({"mem_bytes": 1.5}, "mem_bytes", "valid integer"),
        ({"time_limit_s": 0}, "time_limit_s", "greater than 0"),
        ({"time_limit_s": 10**9}, "time_limit_s", "less than or equal"),
        ({"time_limit_s": 60, "est_runtime_s": 120}, "", "est_runtime_s (120) is longer"),
    ],
)
def test_bad_values_are_refused_naming_the_field(
    fields: dict[str, Any], loc: str, text: str
) -> None:
    with pytest.raises(ValidationError) as exc:
        _req(**fields)
    (err,) = exc.value.errors()
    assert ".".join(str(p) for p in err["loc"]) == loc
    assert text in err["msg"]


def test_launch_carries_limits_run_as_and_the_configured_pids_limit(tmp_path: Path) -> None:
    alice = RunAs("alice", 1234, 1234, (1234,))
    cfg = ControlConfig(run_as={"vision": alice}, job_pids_limit=300)
    spec = _req(cpus=1.5, mem_bytes=GIB, time_limit_s=5, env={"A": "1"})
    members = [Member(0, "local-0", ("0",))]
    launch = launch_for(cfg, tmp_path, "j7", 2, "vision", spec, members)
    assert launch.limits == Limits(cpus=1.5, mem_bytes=GIB, pids=300, log_bytes=GIB)
    assert launch.run_as == alice
    assert launch.attempt_dir == tmp_path / "jobs" / "j7" / "attempt-2"
    assert launch.checkpoint_dir == tmp_path / "jobs" / "j7" / "checkpoints"
    own = {k: v for k, v in launch.env.items() if not k.startswith("SLURM_")}  # test_slurmenv
    assert own == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "A": "1"}
    other = launch_for(cfg, tmp_path, "j8", 1, "nlp", _req(), members)
    assert other.run_as is None
    assert other.limits == Limits(None, None, 300, GIB, frozenset({"cpus", "mem_bytes"}))


def test_the_log_limit_is_the_partitions_unless_the_submit_asks_for_less(tmp_path: Path) -> None:
    home = Partition("p", frozenset(WorkloadClass), log_limit_bytes=64 << 20)
    members = [Member(0, "local-0", ("0",))]

    def limit(**fields: Any) -> int | None:
        spec = _req(**fields)
        return launch_for(
            ControlConfig(), tmp_path, "j1", 1, "t", spec, members, home
        ).limits.log_bytes

    assert limit() == 64 << 20
    assert limit(log_limit_bytes=1 << 20) == 1 << 20
    assert limit(log_limit_bytes=GIB) == 64 << 20  # a tenant cannot lift its own cap


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("4G", 4 * GIB),
        ("4GiB", 4 * GIB),
        ("4gb", 4 * GIB),
        ("512M", 512 << 20),
        ("1.5G", 3 * GIB // 2),
        ("64k", 64 << 10),
        ("100B", 100),
        ("2T", 2 << 40),
    ],
)
def test_sizes(text: str, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize(
    ("text", "why"),
    [("4096", "has no unit: write 4096M"), ("4X", "unknown unit 'X'"), ("lots", "not a size")],
)
def test_bad_sizes(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "s"),
    [
        ("90", 90.0),
        ("2s", 2.0),
        ("0.5s", 0.5),
        ("30m", 1800.0),
        ("1h30m", 5400.0),
        ("2d", 172800.0),
        ("01:30:00", 5400.0),
        ("90:00", 5400.0),
        ("1-00:00:10", 86410.0),
    ],
)
def test_durations(text: str, s: float) -> None:
    assert parse_duration(text) == s


@pytest.mark.parametrize("text", ["", "1x", "1h1h", "h", "01:61:00", "soon"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match=r"write e\.g\. 90"):
        parse_duration(text)


def test_formats_read_back() -> None:
    assert format_size(8 * GIB) == "8G"
    assert format_size(1536 << 20) == "1.5G"
    assert format_duration(5400) == "1h30m"
    assert format_duration(2) == "2s"
    assert parse_duration(format_duration(93784)) == 93784
