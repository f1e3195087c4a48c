"""MIG device isolation on real cgroups: instances the MIG manager creates while the server runs
(on the fake NVML, over a fake driver capability tree), one job on each of two MIG GPUs.

The capability devices are ``mknod`` character devices of a major no driver on this machine
has: an open the cgroup lets through reaches no driver and fails ENXIO, one it refuses fails
EPERM before that. The GPUs' nodes have ``/dev/full``'s and ``/dev/random``'s numbers, so an
allowed one opens.

The first job's cgroup is made before the second GPU is re-partitioned (the second job asks for
a 7g instance: a GPU of its own); it must still be refused the second instance's devices (the
deny list holds every instance a MIG GPU could get), and the second job, on an instance created
while the first ran, must be allowed its own (the MIG manager records them) and nothing else.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from containment_helpers import mknod, need_root

from gpufence.control.base.config import ADMIN, cluster_from_spec_dict, control_config
from gpufence.control.base.containment_settings import ContainmentSettings
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.containment import bpfdev
from gpufence.control.containment.cgroup import CgroupDriver
from gpufence.control.containment.devicerules import DeviceRule
from gpufence.control.containment.members import Containment
from gpufence.control.gpus.devnodes import all_nodes
from gpufence.control.gpus.discovery import Discovery, discover
from gpufence.control.plane import ControlPlane
from gpufence.control.store import database as st
from gpufence.testing.fake_caps import COMPUTE_INSTANCES, GPU_INSTANCES, FakeCaps, minor_of
from gpufence.testing.fake_nvml import FakeNvml, hgx_h100
from gpufence.testing.waiting import until

pytestmark = pytest.mark.slow

SPEC: dict[str, Any] = {
    "name": "box",
    "node_groups": [{"name": "box", "count": 1, "gpus_per_node": 2, "gpu_type": "H100-80GB"}],
    "partitions": {
        "p": {
            "nodes": ["box"],
            "admits": ["batch"],
            "sharing": "mig",
            "mig": {"layout": [], "dynamic": True, "reconfigure_delay_s": 30},
        }
    },
}

# waits for argv[1] to exist (if given), then opens every node of the directories argv[2:];
# prints its MIG device and what each open gave
OPENS = """
    import errno, json, os, sys, time
    while sys.argv[1] and not os.path.exists(sys.argv[1]):
        time.sleep(0.02)
    paths = sorted(os.path.join(d, n) for d in sys.argv[2:] for n in os.listdir(d))
    out = {}
    for path in paths:
        try:
            os.close(os.open(path, os.O_RDONLY))
            out[path] = "ok"
        except OSError as exc:
            out[path] = errno.errorcode[exc.errno]
    print(json.dumps({"mig": os.environ["CUDA_VISIBLE_DEVICES"], "opened": out}))
"""


def test_a_device_program_of_many_scattered_rules_loads() -> None:
    """Hundreds of rules that make no runs (the worst case for the program's size) load: the
    verifier's log, which overflowed its buffer past ~20 rules, is asked for only on failure."""
    need_root()
    why = bpfdev.probe()
    if why is not None:
        pytest.skip(why)
    os.close(bpfdev.load([DeviceRule("c", 236, 2 * m) for m in range(500)]))


def _free_major() -> int:
    """A character major no driver here has (the 234-254 "dynamic" range)."""
    text = Path("/proc/devices").read_text().split("Block devices:")[0]
    taken = {int(p[0]) for p in (ln.split() for ln in text.splitlines()) if p and p[0].isdigit()}
    for major in range(234, 255):
        if major not in taken:
            return major
    pytest.skip("no free character device major on this machine for stand-in MIG devices")


@pytest.fixture
def rig(tmp_path: Path, driver: CgroupDriver) -> Iterator[tuple[ControlPlane, FakeNvml, Path]]:
    if driver.device_isolation == "off":
        pytest.skip(f"device isolation is off in this mode: {driver.describe()}")
    caps = FakeCaps(tmp_path / "driver")
    major = _free_major()
    for gpu in (0, 1):  # every capability the GPUs could get, as a driver has them
        for gi in range(GPU_INSTANCES):
            for ci in (None, *range(COMPUTE_INSTANCES)):
                mknod(Path(caps.node(gpu, gi, ci)), major, minor_of(gpu, gi, ci))
    (tmp_path / "gpus").mkdir()
    nodes = [mknod(tmp_path / "gpus" / f"nvidia{i}", 1, 7 + i) for i in (0, 1)]
    nvml = FakeNvml(hgx_h100(2, mig=2), caps=caps)
    found = discover(nvml, caps.tree)
    gpus = tuple(replace(g, device_nodes=(str(n),)) for g, n in zip(found.gpus, nodes, strict=True))
    found = replace(found, gpus=gpus)
    contain = Containment(driver, ContainmentSettings(pids_max=None), all_nodes(found))
    plane = _plane(tmp_path, found, contain, nvml)
    try:
        yield plane, nvml, caps.tree.dev
    finally:
        plane.close(kill_jobs=True)


def _plane(tmp: Path, found: Discovery, contain: Containment, nvml: FakeNvml) -> ControlPlane:
    cfg = control_config(
        {"gpu_sample_interval_s": 3600, "stop_grace_s": 1, "job_pids_limit": None}, tmp
    )
    p = ControlPlane(
        cluster_from_spec_dict(SPEC), cfg, found, tmp / "data", containment=contain, nvml=nvml
    )
    p.start()
    return p


def _submit(p: ControlPlane, *args: str, mig: str = "3g.40gb") -> str:
    command = [sys.executable, "-c", textwrap.dedent(OPENS), *args]
    req = SubmitRequest.model_validate({"command": command, "class": "batch", "mig": mig})
    return p.submit(req, ADMIN).job_id


def _state(p: ControlPlane, jid: str) -> str:
    row = p.job(jid, ADMIN)
    assert row is not None
    return row.state


def _seen(p: ControlPlane, jid: str) -> dict[str, Any]:
    until(lambda: _state(p, jid) in (st.DONE, st.FAILED), 30, f"job {jid} to end")
    assert _state(p, jid) == st.DONE, p.log_path(jid, 1).read_text()
    out: dict[str, Any] = json.loads(p.log_path(jid, 1).read_text().splitlines()[-1])
    return out


def test_jobs_on_runtime_created_instances_open_only_their_own_capabilities(
    rig: tuple[ControlPlane, FakeNvml, Path], tmp_path: Path
) -> None:
    p, nvml, dev = rig
    go = tmp_path / "go"
    dirs = (str(tmp_path / "gpus"), str(dev))
    first = _submit(p, str(go), *dirs)
    until(lambda: _state(p, first) == st.RUNNING, 20, "the first MIG job running")
    # its cgroup was made before the second GPU had any instance (the first GPU was cut into a
    # full layout: the job's 3g and four idle 1g)
    assert (len(nvml.gpus[0].migs), len(nvml.gpus[1].migs)) == (5, 0)
    second = _submit(p, "", *dirs, mig="7g.80gb")
    b = _seen(p, second)
    go.write_text("")
    a = _seen(p, first)
    where = {m.uuid: (i, m) for i in (0, 1) for m in nvml.gpus[i].migs}
    assert (where[a["mig"]][0], where[b["mig"]][0]) == (0, 1)
    enxio, eperm = errno.errorcode[errno.ENXIO], errno.errorcode[errno.EPERM]
    for seen in (a, b):
        gpu, m = where[seen["mig"]]
        caps = {str(dev / f"nvidia-cap{minor_of(gpu, m.gi_id, c)}") for c in (None, m.ci_id)}
        node = str(tmp_path / "gpus" / f"nvidia{gpu}")
        opened: dict[str, str] = seen["opened"]
        assert opened.pop(node) == "ok"
        assert {k: v for k, v in opened.items() if k in caps} == dict.fromkeys(caps, enxio)
        refused = {k: v for k, v in opened.items() if k not in caps}
        assert refused == dict.fromkeys(refused, eperm)
        assert len(refused) == 1 + 2 * GPU_INSTANCES * (1 + COMPUTE_INSTANCES) - 2
