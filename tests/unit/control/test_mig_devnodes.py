"""MIG capability devices over a fake driver capability tree (``testing/fake_caps.py``) and the
fake NVML: an instance the MIG manager creates while the server runs gets its own capability
devices in the ``DeviceMap`` (a destroyed one loses them), the deny list fixed at start-up
already holds every instance a GPU could get, a capability device without its node yet is ruled
by its number, and the BPF program tests runs of minors the way it tests single rules."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from gpufence.control.containment import bpfdev, devicerules
from gpufence.control.containment.devicerules import DeviceRule, denied, rule_of
from gpufence.control.gpus.devices import DeviceMap
from gpufence.control.gpus.devnodes import all_nodes, gpu_mig_caps
from gpufence.control.gpus.discovery import discover
from gpufence.control.gpus.mig_manager import MigManager
from gpufence.model.decisions import Assignment, MigReconfigure, Reason
from gpufence.model.events import MigReconfigured
from gpufence.spec import cluster_from_dict
from gpufence.testing.fake_caps import COMPUTE_INSTANCES, GPU_INSTANCES, FakeCaps, minor_of
from gpufence.testing.fake_nvml import FakeMig, FakeNvml, hgx_h100

PER_GPU = GPU_INSTANCES * (1 + COMPUTE_INSTANCES)


def _spec(n: int) -> dict[str, object]:
    mig = {"layout": [], "dynamic": True, "reconfigure_delay_s": 30}
    part = {"nodes": ["n"], "admits": ["batch"], "sharing": "mig", "mig": mig}
    return {
        "name": "t",
        "node_groups": [{"name": "n", "count": 1, "gpus_per_node": n, "gpu_type": "H100-80GB"}],
        "partitions": {"p": part},
    }


def _on(profile: str, start: int) -> Assignment:
    return Assignment(0, (0,), mig_profile=profile, mig_start=start)


def test_instances_created_at_runtime_get_their_capability_devices(tmp_path: Path) -> None:
    caps = FakeCaps(tmp_path)
    nvml = FakeNvml(hgx_h100(1, mig=1), caps=caps)
    found = discover(nvml, caps.tree)  # the GPU has no instance yet
    cluster = cluster_from_dict(_spec(1), source="test")
    devices = DeviceMap(cluster, found)
    deny = set(all_nodes(found))  # what containment is given at start-up
    mgr = MigManager(cluster, devices, nvml, threaded=False)
    mgr.reconfigure(MigReconfigure(0, ("3g.40gb@0", "3g.40gb@4"), Reason.MIG_LAYOUT, 30), 0.0)
    assert mgr.ready(0.0) == [MigReconfigured(0)]
    made = {m.start: m for m in nvml.gpus[0].migs}
    assert set(made) == {0, 4}
    own = {
        s: ("/dev/nvidia0", caps.node(0, m.gi_id), caps.node(0, m.gi_id, m.ci_id))
        for s, m in made.items()
    }
    for start, nodes in own.items():
        assert devices.nodes(_on("3g.40gb", start)) == nodes
        other = own[4 - start]
        # the deny list fixed before the instances existed covers the other one's devices
        assert set(other[1:]) <= deny - set(nodes)
        assert set(nodes) <= deny
    # re-partitioned again: the destroyed instances' devices go, the new one's come
    mgr.reconfigure(MigReconfigure(0, ("7g.80gb@0",), Reason.MIG_LAYOUT, 30), 1.0)
    assert mgr.ready(1.0) == [MigReconfigured(0)]
    (whole,) = nvml.gpus[0].migs
    assert devices.nodes(_on("3g.40gb", 0)) == ("/dev/nvidia0",)
    assert devices.nodes(_on("7g.80gb", 0)) == (
        "/dev/nvidia0",
        caps.node(0, whole.gi_id),
        caps.node(0, whole.gi_id, whole.ci_id),
    )


def test_startup_records_the_capability_devices_of_the_instances_read(tmp_path: Path) -> None:
    caps = FakeCaps(tmp_path)
    gpus = hgx_h100(1, mig=1)
    gpus[0].migs = [FakeMig("MIG-x", gi_id=2, profile_id=9, start=4, size=4, slices=3, mem_mb=1)]
    nvml = FakeNvml(gpus, caps=caps)
    cluster = cluster_from_dict(_spec(1), source="test")
    devices = DeviceMap(cluster, discover(nvml, caps.tree))
    MigManager(cluster, devices, nvml, threaded=False).startup()
    assert devices.nodes(_on("3g.40gb", 4)) == (
        "/dev/nvidia0",
        caps.node(0, 2),
        caps.node(0, 2, 0),
    )


def test_the_deny_list_holds_every_capability_of_each_mig_gpu_and_only_theirs(
    tmp_path: Path,
) -> None:
    caps = FakeCaps(tmp_path)
    found = discover(FakeNvml(hgx_h100(3, mig=2), caps=caps), caps.tree)
    nodes = all_nodes(found)
    expect = {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"} | {
        caps.node(gpu, gi, ci)
        for gpu in (0, 1)
        for gi in range(GPU_INSTANCES)
        for ci in (None, *range(COMPUTE_INSTANCES))
    }
    assert set(nodes) == expect and len(nodes) == 3 + 2 * PER_GPU  # none of GPU 2's
    # an old driver without the table: the instances that exist now, from their access files
    caps.tree.minors.unlink()
    caps.sync([(0, 5, None), (0, 5, 0), (1, 1, None)])
    assert gpu_mig_caps(0, caps.tree) == (caps.node(0, 5), caps.node(0, 5, 0))


def test_a_capability_device_without_its_node_is_ruled_by_its_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = "/dev/nvidia-caps/nvidia-cap12"
    if Path(path).exists():
        pytest.skip(f"{path} exists on this machine: its rule comes from the node itself")
    devices = tmp_path / "devices"
    devices.write_text("Character devices:\n  1 mem\n236 nvidia-caps\n\nBlock devices:\n  8 sd\n")
    monkeypatch.setattr(devicerules, "PROC_DEVICES", devices)
    assert rule_of(path) == DeviceRule("c", 236, 12)
    assert rule_of(str(tmp_path / "nvidia-caps" / "nvidia-cap12")) is None  # only /dev's
    assert denied([path, "/dev/nvidia-caps/nvidia-cap13"], [path]) == (DeviceRule("c", 236, 13),)
    devices.write_text("Character devices:\n  1 mem\n\nBlock devices:\n236 nvidia-caps\n")
    monkeypatch.setattr(devicerules, "PROC_DEVICES", tmp_path / "devices")
    devicerules._majors.clear()
    assert rule_of(path) is None  # no such character driver: nothing to rule


def _run(code: bytes, kind: int, major: int, minor: int) -> int:
    """A small interpreter of the instructions ``bpfdev.program`` emits."""
    insns = [struct.unpack("<BBhi", code[i : i + 8]) for i in range(0, len(code), 8)]
    ctx = [kind | (3 << 16), major, minor]  # access_type = type | access << 16
    reg = [0] * 11
    pc = 0
    while True:
        op, regs, off, imm = insns[pc]
        dst, src = regs & 0xF, regs >> 4
        pc += 1
        if op == 0x61:
            reg[dst] = ctx[off // 4] if src == 1 else 0
        elif op == 0x57:
            reg[dst] &= imm
        elif op == 0xB7:
            reg[dst] = imm
        elif op == 0x95:
            return reg[0]
        elif (
            (op == 0x55 and reg[dst] != imm)
            or (op == 0x25 and reg[dst] > imm)
            or (op == 0xA5 and reg[dst] < imm)
        ):
            pc += off
        else:
            assert op in (0x55, 0x25, 0xA5), f"unexpected opcode {op:#x}"


def test_the_bpf_program_denies_runs_of_minors_in_few_instructions() -> None:
    own = {minor_of(0, 1), minor_of(0, 1, 0)}
    every = [DeviceRule("c", 195, 0)] + [
        DeviceRule("c", 236, m) for m in range(minor_of(0, 0), minor_of(1, 0))
    ]
    deny = sorted(r for r in every if r.minor not in own or r.major != 236)
    code = bpfdev.program(deny)
    assert bpfdev.runs(deny) == [
        ("c", 195, 0, 0),
        ("c", 236, minor_of(0, 0), minor_of(0, 1) - 1),
        ("c", 236, minor_of(0, 1, 1), minor_of(1, 0) - 1),
    ]
    assert len(code) // 8 == 4 + 5 + 6 + 6 + 2  # not 5 per denied minor
    for minor in range(0, minor_of(1, 0) + 3):
        refused = minor in {r.minor for r in deny if r.major == 236}
        assert _run(code, 2, 236, minor) == (0 if refused else 1), minor
    assert _run(code, 2, 195, 0) == 0 and _run(code, 2, 195, 1) == 1
    assert _run(code, 1, 236, minor_of(0, 0)) == 1  # a block device of that number: not ours
