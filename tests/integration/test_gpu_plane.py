"""The control plane's real-GPU paths end to end on the fake NVML: real SQLite, real job
processes (local executor), a real fake ``nvidia-cuda-mps-control`` and real "foreign"
processes.

* dynamic MIG: the job runs with the MIG UUID the MIG manager created through NVML;
* fractional shares: one MPS daemon per GPU, each share gets its pipe dir and limits; without
  the executable the partition says it is not enforced;
* foreign processes: a process on a GPU that no job holding it owns is counted, logged, shown
  on ``nodes``, and killed with ``foreign_gpu_processes: kill``; the jobs' own are left alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufence.cli.clustertables import gpu_notes, unenforced
from gpufence.control.base.config import ADMIN, cluster_from_spec_dict, control_config
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.gpus.discovery import discover
from gpufence.control.plane import ControlPlane
from gpufence.control.store import database as st
from gpufence.testing.fake_mps import install, log_lines, path_with
from gpufence.testing.fake_nvml import FakeNvml, FakeProc, hgx_h100
from gpufence.testing.waiting import until

pytestmark = pytest.mark.slow  # real control planes and processes (~15 s)

# prints its CUDA variables and pid, then sleeps for argv[1] seconds
SHOW = (
    "import json, os, sys, time; "
    "print(json.dumps({'pid': os.getpid(), **{k: v for k, v in os.environ.items() "
    "if k.startswith('CUDA_')}}), flush=True); time.sleep(float(sys.argv[1]))"
)


def _job(sleep: float = 0.0, **fields: Any) -> SubmitRequest:
    return SubmitRequest.model_validate(
        {"command": [sys.executable, "-c", SHOW, str(sleep)], "class": "batch", **fields}
    )


def _spec(sharing: str, gpus: int = 1) -> dict[str, Any]:
    part: dict[str, Any] = {"nodes": ["box"], "admits": ["batch"], "sharing": sharing}
    if sharing == "mig":
        part["mig"] = {"layout": [], "dynamic": True, "reconfigure_delay_s": 30}
    return {
        "name": "box",
        "node_groups": [
            {"name": "box", "count": 1, "gpus_per_node": gpus, "gpu_type": "H100-80GB"}
        ],
        "partitions": {"p": part},
    }


Make = Callable[..., ControlPlane]


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Make]:
    made: list[ControlPlane] = []

    def make(spec: dict[str, Any], nvml: FakeNvml, **control: Any) -> ControlPlane:
        cfg = control_config({"gpu_sample_interval_s": 3600, **control}, tmp_path)
        data = tmp_path / f"data{len(made)}"
        p = ControlPlane(cluster_from_spec_dict(spec), cfg, discover(nvml), data, nvml=nvml)
        p.start()
        made.append(p)
        return p

    yield make
    for p in made:
        p.close(kill_jobs=True)


def _shown(p: ControlPlane, job_id: str) -> dict[str, Any]:
    """The first line the job printed (its CUDA variables and pid)."""
    path = p.log_path(job_id, 1)
    until(lambda: path.exists() and path.read_text().strip() != "", 20, f"{job_id}'s output")
    out: dict[str, Any] = json.loads(path.read_text().splitlines()[0])
    return out


def _state(p: ControlPlane, job_id: str) -> str:
    row = p.job(job_id, ADMIN)
    assert row is not None
    return row.state


def test_a_dynamic_mig_job_sees_the_instance_gpufence_created(plane: Make) -> None:
    nvml = FakeNvml(hgx_h100(1, mig=1))
    p = plane(_spec("mig"), nvml)
    jid = p.submit(_job(mig="2g.20gb"), ADMIN).job_id
    until(lambda: _state(p, jid) == st.DONE, 20, "the MIG job done")
    (mig,) = [m for m in nvml.gpus[0].migs if m.slices == 2]
    assert _shown(p, jid)["CUDA_VISIBLE_DEVICES"] == mig.uuid
    # a full layout: the 2g where it leaves a 4g placeable, the rest cut into 1g
    ones = [f"1g.10gb@{s}" for s in (0, 1, 2, 3, 6)]
    assert nvml.gpus[0].layout() == sorted([*ones, "2g.20gb@4"])


def test_a_mig_job_on_metrics_names_its_instance_and_the_instance_memory(
    plane: Make, tmp_path: Path
) -> None:
    """gpufence_gpu_allocated carries the MIG device UUID the job was given (``mig``), the GPU
    sampler reads that instance's memory from NVML (gpufence_mig_memory_used_bytes), and
    dcgm-exporter's job-mapping file of the instance (``<gpu>.<GPU instance id>``) names it."""
    nvml = FakeNvml(hgx_h100(1, mig=1))
    jobmap = tmp_path / "job-mapping"
    p = plane(_spec("mig"), nvml, telemetry={"dcgm_job_mapping_dir": str(jobmap)})
    jid = p.submit(_job(30, mig="2g.20gb"), ADMIN).job_id
    until(lambda: _state(p, jid) == st.RUNNING, 20, "the MIG job running")
    (mig,) = [m for m in nvml.gpus[0].migs if m.slices == 2]  # (the rest: idle 1g instances)
    nvml.gpus[0].mig_used_mib[mig.uuid] = 1234
    p.gpus.sample_once(p._holders())
    text = p.metrics().decode()
    held = [ln for ln in text.splitlines() if ln.startswith("gpufence_gpu_allocated{")]
    assert len(held) == 1 and f'mig="{mig.uuid}"' in held[0] and f'job_id="{jid}"' in held[0]
    mem = f'gpufence_mig_memory_used_bytes{{gpu="0",mig="{mig.uuid}",node="box-0",uuid="GPU-'
    line = next(ln for ln in text.splitlines() if ln.startswith(mem))
    assert float(line.rsplit(" ", 1)[1]) == float(1234 << 20)
    assert 'gpufence_gpu_utilization{gpu="0"' not in text  # NVML has none in MIG mode
    p.nodes()  # a reconciler cycle: the job map is written after it
    files = {f.name: f.read_text() for f in jobmap.iterdir()}
    mine = {"0": f"{jid}\n", f"0.{mig.gi_id}": f"{jid}\n"}
    idle = {f"0.{m.gi_id}": "" for m in nvml.gpus[0].migs if m is not mig}  # the idle 1g
    assert files == {**mine, **idle}
    p.cancel(jid, ADMIN)
    until(lambda: _state(p, jid) == st.CANCELLED, 20, "the MIG job cancelled")
    p.nodes()
    assert (jobmap / "0").read_text() == ""


def test_fractional_shares_run_under_one_mps_daemon_per_gpu(
    plane: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(tmp_path / "bin")
    monkeypatch.setenv("PATH", path_with(tmp_path / "bin"))
    nvml = FakeNvml(hgx_h100(2))
    p = plane(_spec("fractional", 2), nvml)
    (part,) = p.partitions()
    assert part["enforced"] is True and part["enforcement"].startswith("MPS:")
    assert unenforced([part]) == []
    a = p.submit(_job(gpu_fraction=0.25, gpu_mem_gib=10), ADMIN).job_id
    b = p.submit(_job(gpu_fraction=0.5), ADMIN).job_id
    ea, eb = _shown(p, a), _shown(p, b)
    gpu = ea["CUDA_VISIBLE_DEVICES"]
    index = [f"GPU-{g.bus}" for g in nvml.gpus].index(gpu)
    pipe = str(p.data_dir / "mps" / f"gpu-{index}" / "pipe")
    assert ea["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert ea["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert ea["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert eb["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert eb["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={81559 // 2}M"
    gpus = p.nodes()[0]["gpus"]
    assert all(g["mps"].startswith("running: pid ") for g in gpus)
    assert "MPS running" in gpu_notes(gpus[0])
    roots = [p.data_dir / "mps" / f"gpu-{i}" for i in (0, 1)]
    assert [len(log_lines(r)) for r in roots] == [1, 1]
    p.close(kill_jobs=True)
    assert all(log_lines(r)[-1].startswith("quit ") for r in roots)


def test_without_mps_a_fractional_partition_says_it_is_not_enforced(
    plane: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path / 'none'}{os.pathsep}/usr/bin:/bin")
    p = plane(_spec("fractional"), FakeNvml(hgx_h100(1)))
    (part,) = p.partitions()
    assert part["enforced"] is False
    assert part["enforcement"].startswith("NOT enforced: MPS unavailable (nvidia-cuda-mps-control")
    gpu = p.nodes()[0]["gpus"][0]
    assert gpu["mps"].startswith("unavailable: nvidia-cuda-mps-control is not on PATH")
    assert "MPS unavailable: nvidia-cuda-mps-control" in gpu_notes(gpu)
    (line,) = unenforced(p.partitions())  # what `gpufence nodes` prints under the GPUs
    assert line.startswith("partition p (fractional): NOT enforced: MPS unavailable")
    jid = p.submit(_job(gpu_fraction=0.5), ADMIN).job_id
    env = _shown(p, jid)
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and "CUDA_MPS_PIPE_DIRECTORY" not in env
    assert b'gpufence_partition_enforced{partition="p",sharing="fractional"} 0.0' in p.metrics()


@pytest.fixture
def intruder() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("policy", ["report", "kill"])
def test_a_foreign_process_is_an_incident(
    plane: Make, intruder: subprocess.Popen[bytes], policy: str
) -> None:
    nvml = FakeNvml(hgx_h100(2))
    p = plane(_spec("exclusive", 2), nvml, foreign_gpu_processes=policy)
    jid = p.submit(_job(30), ADMIN).job_id
    mine = _shown(p, jid)
    gpu = int(mine["CUDA_VISIBLE_DEVICES"])
    other = 1 - gpu
    # NVML lists the job's own process on its GPU, the intruder there too, and the job's
    # process on the GPU it does not hold
    nvml.gpus[gpu].procs = [FakeProc(mine["pid"]), FakeProc(intruder.pid)]
    nvml.gpus[other].procs = [FakeProc(mine["pid"])]
    p.gpus.sample_once(p._holders())
    gpus = p.nodes()[0]["gpus"]
    (seen,) = gpus[gpu]["foreign"]
    assert seen["pid"] == intruder.pid and seen["command"] == "sleep 60" and seen["job"] is None
    assert seen["user"] and seen["action"] == ("killed" if policy == "kill" else "reported")
    (stray,) = gpus[other]["foreign"]
    assert stray["pid"] == mine["pid"] and stray["job"] == jid
    metrics = p.metrics()
    assert b'gpufence_foreign_gpu_process_incidents_total{gpu="%d"} 1.0' % gpu in metrics
    assert b'gpufence_foreign_gpu_processes{gpu="%d"' % gpu in metrics
    assert f"FOREIGN process pid {intruder.pid}" in gpu_notes(gpus[gpu])
    if policy == "kill":
        assert intruder.wait(5) == -9
        until(lambda: _state(p, jid) == st.FAILED, 10, "the stray job process killed too")
    else:
        assert intruder.poll() is None
        assert _state(p, jid) == st.RUNNING
        p.gpus.sample_once(p._holders())  # seen again: still one incident, not two
        assert b'_incidents_total{gpu="%d"} 1.0' % gpu in p.metrics()
    # a tenant sees that something is there, not whose
    tenant_view = p.nodes("someone")[0]["gpus"][gpu]["foreign"]
    assert tenant_view and set(tenant_view[0]) == {"action", "since"}


def test_a_restart_takes_back_a_mig_job_on_the_instance_it_runs_on(tmp_path: Path) -> None:
    """The spec's dynamic layout is empty; the GPU has the instance gpufence created for the
    running job: start-up reads it (before recovery restores the job onto it), so the job is
    adopted where it runs and nothing else is placed there."""
    nvml = FakeNvml(hgx_h100(1, mig=1))
    cfg = control_config({"gpu_sample_interval_s": 3600}, tmp_path)
    data = tmp_path / "data"

    def plane() -> ControlPlane:
        p = ControlPlane(cluster_from_spec_dict(_spec("mig")), cfg, discover(nvml), data, nvml=nvml)
        p.start()
        return p

    first = plane()
    jid = first.submit(_job(30, mig="7g.80gb"), ADMIN).job_id
    uuid = _shown(first, jid)["CUDA_VISIBLE_DEVICES"]
    first.close(kill_jobs=False)  # the job keeps running
    second = plane()
    try:
        assert second.recovered["adopted"] == 1
        slot = second.nodes()[0]["gpus"][0]["mig"]
        assert slot == [{"profile": "7g.80gb", "start": 0, "job": jid}]
        assert "refused" not in second.nodes()[0]["gpus"][0]
        assert [m.uuid for m in nvml.gpus[0].migs] == [uuid]  # not re-created
        other = second.submit(_job(0, mig="7g.80gb"), ADMIN)
        assert other.state == "pending"
    finally:
        second.close(kill_jobs=True)
