"""Containment through the control plane: what `gpufence up` does and what `status` shows.

* a job that leaves a process behind is `done` with "stray processes killed: N" (and an event),
  and the next job on its GPU starts only once that process is gone;
* a job over its memory limit ends `failed`, reason `oom`;
* with fake GPUs backed by `mknod` device nodes (`control.containment.fake_gpu_devices`), a job
  opens its own GPU's node and gets EPERM on the other's;
* start-up: the mode is detected and logged; a machine without it is refused with the way out;
  `--no-containment` is logged loudly.
"""

from __future__ import annotations

import errno
import json
import logging
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from containment_helpers import mknod, need_root

from gpufence.control.base.config import ADMIN, cluster_from_spec_dict, control_config
from gpufence.control.base.containment_settings import ContainmentSettings
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.containment.cgroup import CgroupDriver
from gpufence.control.containment.members import Containment
from gpufence.control.gpus.devnodes import all_nodes, with_fake_nodes
from gpufence.control.gpus.discovery import Discovery, fake_gpus, node_spec
from gpufence.control.http.server import StartupError, build_plane
from gpufence.control.plane import ControlPlane
from gpufence.testing.waiting import until

Make = Callable[..., ControlPlane]


@pytest.fixture
def make(tmp_path: Path, v1: CgroupDriver) -> Iterator[Make]:
    made: list[ControlPlane] = []

    def build(gpus: int = 1, discovery: Discovery | None = None) -> ControlPlane:
        d = discovery or fake_gpus(gpus)
        contain = Containment(v1, ContainmentSettings(), all_nodes(d))
        cfg = control_config({"stop_grace_s": 1}, tmp_path)
        spec = cluster_from_spec_dict(node_spec(d))
        p = ControlPlane(spec, cfg, d, tmp_path / "data", containment=contain)
        p.start()
        made.append(p)
        return p

    yield build
    for p in made:
        p.close(kill_jobs=True)


def _submit(p: ControlPlane, command: list[str], **fields: Any) -> str:
    req = SubmitRequest.model_validate({"command": command, "gpus": 1, **fields})
    return p.submit(req, ADMIN).job_id


def _ended(p: ControlPlane, jid: str, timeout: float = 20.0) -> Any:
    def over() -> bool:
        row = p.job(jid, ADMIN)
        return row is not None and row.state in ("done", "failed")

    until(over, timeout, f"job {jid} to end")
    return p.job(jid, ADMIN)


def test_strays_are_reported_and_the_gpu_waits_for_them(make: Make, tmp_path: Path) -> None:
    p = make(gpus=1)
    pidfile = tmp_path / "stray.pid"
    escape = f"setsid sleep 300 & echo $! > {pidfile}; exit 0"
    check = textwrap.dedent(f"""
        import os
        pid = int(open({str(pidfile)!r}).read())
        try:
            state = open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "gone"
        print("stray:", "gone" if state in ("gone", "Z", "X") else "alive")
    """)
    first = _submit(p, ["sh", "-c", escape])
    second = _submit(p, [sys.executable, "-c", check])  # waits for the one GPU
    row = _ended(p, first)
    assert row.state == "done"
    assert row.message == "stray processes killed: 1"
    assert any(e["kind"] == "strays-killed" for e in p.events(ADMIN, job_id=first))
    assert _ended(p, second).state == "done"
    out = p.log_path(second, 1).read_text()
    assert "stray: gone" in out


def test_a_job_over_its_memory_limit_fails_with_reason_oom(make: Make) -> None:
    p = make(gpus=1)  # the submit's memory limit reaches the cgroup (launches.launch_for)
    jid = _submit(p, [sys.executable, "-c", "x = bytearray(512 << 20)"], mem_bytes=64 << 20)
    row = _ended(p, jid)
    assert (row.state, row.reason) == ("failed", "oom")
    assert "out-of-memory" in row.message
    assert any(e["kind"] == "exited" and e["reason"] == "oom" for e in p.events(ADMIN, job_id=jid))


OPEN_BOTH = """
    import errno, json, os, sys
    out = {"mine": os.environ["CUDA_VISIBLE_DEVICES"]}
    for i, path in enumerate(sys.argv[1:]):
        try:
            os.close(os.open(path, os.O_RDONLY))
            out[str(i)] = "ok"
        except OSError as exc:
            out[str(i)] = errno.errorcode[exc.errno]
    print(json.dumps(out))
"""


def test_fake_gpus_backed_by_device_nodes_are_isolated(make: Make, tmp_path: Path) -> None:
    nodes = [mknod(tmp_path / f"fakegpu{i}", 1, 7 + i) for i in range(2)]
    d = with_fake_nodes(fake_gpus(2), str(tmp_path / "fakegpu{index}"))
    p = make(discovery=d)
    jid = _submit(p, [sys.executable, "-c", textwrap.dedent(OPEN_BOTH), *map(str, nodes)])
    assert _ended(p, jid).state == "done"
    seen = json.loads(p.log_path(jid, 1).read_text())
    mine = seen.pop("mine")
    other = "1" if mine == "0" else "0"
    assert seen == {mine: "ok", other: errno.errorcode[errno.EPERM]}


CONFIG = """
name: containment-test
node_groups:
  - {{name: g, count: 1, gpus_per_node: 2, gpu_type: H100-80GB}}
partitions:
  all: {{nodes: [g], admits: [serving, training, interactive, batch], sharing: exclusive}}
control:
  containment: {containment}
"""


def _config(tmp_path: Path, **containment: Any) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(CONFIG.format(containment=json.dumps(containment)), encoding="utf-8")
    return path


def test_start_up_detects_and_logs_the_mode(
    tmp_path: Path, cgroup_parent: str, v1: CgroupDriver, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _config(tmp_path, cgroup_parent=cgroup_parent, prestarted=0)
    plane = build_plane(cfg, tmp_path / "data", 2)
    try:
        assert plane.containment is not None
        with caplog.at_level(logging.INFO, logger="gpufence.plane"):
            plane.start()
        assert any("containment: cgroup v" in r.getMessage() for r in caplog.records)
    finally:
        plane.close(kill_jobs=True)


def test_a_machine_without_containment_is_refused_with_the_way_out(
    tmp_path: Path, cgroup_parent: str
) -> None:
    need_root()
    from gpufence.control.containment import mounts

    if {"cpu", "memory", "pids"} <= mounts.current().v2_controllers():
        pytest.skip("this machine has cgroup v2 with controllers: nothing to refuse")
    cfg = _config(tmp_path, cgroup_parent=cgroup_parent, mode="v2")  # what this machine lacks
    with pytest.raises(StartupError, match="--no-containment") as err:
        build_plane(cfg, tmp_path / "data", 2)
    assert "cgroup v2" in str(err.value)


def test_no_containment_is_logged_loudly(
    tmp_path: Path, cgroup_parent: str, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _config(tmp_path, cgroup_parent=cgroup_parent, mode="v2")
    with caplog.at_level(logging.WARNING, logger="gpufence.server"):
        plane = build_plane(cfg, tmp_path / "data", 2, no_containment=True)
    try:
        assert plane.containment is None
        assert any(
            r.levelno == logging.WARNING and "CONTAINMENT IS OFF" in r.getMessage()
            for r in caplog.records
        )
    finally:
        plane.close(kill_jobs=True)
