"""A process on a GPU is its job's by the member's cgroup (``GpuRuntime.member_cgroup``).

With containment on, the control plane hands the GPU sampler each member's cgroup path
(``Containment.path_of``), so a job's process that left its session and process group
(``setsid``) is still the job's on the job's GPU, not a foreign one; a process that is in no
member's cgroup still is. Real cgroups (v1, under a parent of this test's own), a real control
plane and real job processes on the fake NVML.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufence.control.base.config import ADMIN, cluster_from_spec_dict, control_config
from gpufence.control.base.containment_settings import ContainmentSettings
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.containment.cgroup import CgroupDriver
from gpufence.control.containment.members import Containment, cgroup_name
from gpufence.control.gpus.discovery import discover
from gpufence.control.plane import ControlPlane
from gpufence.testing.fake_nvml import FakeNvml, FakeProc, hgx_h100
from gpufence.testing.waiting import until

# prints its pid and that of a child it put in a session of its own, then waits
ESCAPE = (
    "import json, subprocess, time; "
    "c = subprocess.Popen(['sleep', '60'], start_new_session=True); "
    "print(json.dumps({'pid': __import__('os').getpid(), 'escaped': c.pid}), flush=True); "
    "time.sleep(60)"
)


@pytest.fixture
def plane(tmp_path: Path, v1: CgroupDriver) -> Iterator[tuple[ControlPlane, FakeNvml]]:
    nvml = FakeNvml(hgx_h100(1))
    discovery = discover(nvml)
    spec = {
        "name": "box",
        "node_groups": [{"name": "box", "count": 1, "gpus_per_node": 1, "gpu_type": "H100-80GB"}],
        "partitions": {"p": {"nodes": ["box"], "admits": ["batch"], "sharing": "exclusive"}},
    }
    cfg = control_config({"gpu_sample_interval_s": 3600}, tmp_path)
    contain = Containment(v1, ContainmentSettings(pids_max=None, prestarted=0))
    p = ControlPlane(
        cluster_from_spec_dict(spec),
        cfg,
        discovery,
        tmp_path / "data",
        containment=contain,
        nvml=nvml,
    )
    p.start()
    try:
        yield p, nvml
    finally:
        p.close(kill_jobs=True)


@pytest.fixture
def intruder() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_jobs_setsid_child_on_its_gpu_is_the_jobs_by_its_cgroup(
    plane: tuple[ControlPlane, FakeNvml], intruder: subprocess.Popen[bytes]
) -> None:
    p, nvml = plane
    req = SubmitRequest.model_validate(
        {"command": [sys.executable, "-c", ESCAPE], "class": "batch", "gpus": 1}
    )
    jid = p.submit(req, ADMIN).job_id
    log = p.log_path(jid, 1)
    until(lambda: log.exists() and log.read_text().strip() != "", 20, "the job's pids")
    pids = json.loads(log.read_text().splitlines()[0])
    ((_, _, launch),) = p._holders()
    path = p.gpus.member_cgroup(launch, 0)
    assert path is not None and path.endswith("/" + cgroup_name(launch, 0))
    in_proc = Path(f"/proc/{pids['escaped']}/cgroup").read_text()
    assert f":{path}\n" in in_proc, in_proc  # the name the kernel shows for it
    nvml.gpus[0].procs = [
        FakeProc(pids["pid"]),
        FakeProc(pids["escaped"]),  # left the job's session and group: its cgroup says whose
        FakeProc(intruder.pid),  # in no member's cgroup: foreign
    ]
    p.gpus.sample_once(p._holders())
    foreign = p.nodes()[0]["gpus"][0]["foreign"]
    assert [f["pid"] for f in foreign] == [intruder.pid], foreign
