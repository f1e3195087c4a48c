"""The pieces of containment that need no cgroup: mount parsing, the BPF program, device rules,
settings, cgroup names, launcher options and the job directories' permission walk."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpufence.control.base.containment_settings import ContainmentSchema, ContainmentSettings
from gpufence.control.base.executor import Launch, Member, RunAs
from gpufence.control.containment import bpfdev
from gpufence.control.containment.cgroup import ContainmentError
from gpufence.control.containment.detect import detect
from gpufence.control.containment.devicerules import DeviceRule, denied, rule_of
from gpufence.control.containment.members import cgroup_name, launcher_args
from gpufence.control.containment.mounts import CgroupMounts, parse
from gpufence.control.gpus.devnodes import mig_nodes, with_fake_nodes
from gpufence.control.gpus.discovery import fake_gpus
from gpufence.control.gpus.records import CapsTree

HYBRID = """\
cgroup /sys/fs/cgroup/cpu cgroup rw,nosuid,nodev,noexec,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,xattr,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
proc /proc proc rw 0 0
"""


def test_mounts_of_a_hybrid_machine() -> None:
    m = parse(HYBRID)
    assert m.v2 == Path("/sys/fs/cgroup/unified")
    assert m.v1 == {
        "cpu": Path("/sys/fs/cgroup/cpu"),  # the first mount of a controller wins
        "cpuacct": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "memory": Path("/sys/fs/cgroup/memory"),
    }


def test_mounts_of_a_pure_v2_machine() -> None:
    m = parse("cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n")
    assert (m.v1, m.v2) == ({}, Path("/sys/fs/cgroup"))


def test_nothing_mounted_is_refused_with_the_way_out() -> None:
    with pytest.raises(ContainmentError, match="--no-containment") as err:
        detect(ContainmentSettings(), CgroupMounts())
    text = str(err.value)
    assert "no cgroup2 file system mounted" in text
    assert "no cpu, memory, pids, freezer hierarchy mounted" in text


def test_the_bpf_program_tests_each_denied_device() -> None:
    rules = [DeviceRule("c", 195, 0), DeviceRule("b", 8, 1)]
    code = bpfdev.program(rules)
    insns = [struct.unpack("<BBhi", code[i : i + 8]) for i in range(0, len(code), 8)]
    assert len(insns) == 4 + 5 * len(rules) + 2
    tests = [(op, regs & 0xF, imm) for op, regs, _off, imm in insns if op == 0x55]
    assert tests == [
        (0x55, 2, 2),
        (0x55, 3, 195),
        (0x55, 4, 0),
        (0x55, 2, 1),
        (0x55, 3, 8),
        (0x55, 4, 1),
    ]
    assert insns[-2][3] == 1 and insns[-1][0] == 0x95  # anything else: allowed


def test_device_rules_are_by_number_and_skip_what_is_not_a_device(tmp_path: Path) -> None:
    null, zero = rule_of("/dev/null"), rule_of("/dev/zero")
    assert null == DeviceRule("c", 1, 3) and zero == DeviceRule("c", 1, 5)
    (tmp_path / "plain").write_text("")
    assert rule_of(str(tmp_path / "plain")) is None
    assert rule_of(str(tmp_path / "missing")) is None
    every = ["/dev/null", "/dev/zero", str(tmp_path / "plain")]
    assert denied(every, ["/dev/zero"]) == (null,)
    assert null is not None and null.v1() == "c 1:3 rwm"


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("cgroup_parent", "gpufence", "absolute cgroup path"),
        ("cgroup_parent", "/a/../b", "absolute cgroup path"),
        ("fake_gpu_devices", "/dev/fake", "{index}"),
        ("fake_gpu_devices", "/dev/fake{index}{x}", "only {index}"),
        ("pids_max", 3, "Extra inputs are not permitted"),  # it is control.job_pids_limit
        ("mode", "v3", "'auto', 'v2' or 'v1'"),
    ],
)
def test_bad_settings_name_the_field(field: str, value: object, says: str) -> None:
    with pytest.raises(ValidationError) as err:
        ContainmentSchema.model_validate({field: value})
    assert err.value.errors()[0]["loc"] == (field,)
    assert says in str(err.value)


def _launch(adir: Path, job: str = "j1", attempt: int = 1) -> Launch:
    return Launch(job, attempt, ("true",), {}, (Member(0, "n", ()),), adir, adir.parent / "ck")


def test_cgroup_names_are_stable_readable_and_unique_per_data_dir(tmp_path: Path) -> None:
    a = cgroup_name(_launch(tmp_path / "d1/jobs/j1/attempt-1"), 0)
    assert a == cgroup_name(_launch(tmp_path / "d1/jobs/j1/attempt-1"), 0)
    assert a.startswith("j1.a1.r0.")
    assert a != cgroup_name(_launch(tmp_path / "d2/jobs/j1/attempt-1"), 0)
    weird = cgroup_name(_launch(tmp_path / "x", job="../etc"), 1)
    assert "/" not in weird and ".." not in weird.split(".a")[0]


def test_launcher_args_put_the_cgroup_before_the_user() -> None:
    assert launcher_args(None, None) == []
    assert launcher_args(None, RunAs("u", 1001, 1002, (1002, 27))) == [
        "--uid",
        "1001",
        "--gid",
        "1002",
        "--groups",
        "1002,27",
    ]


def test_fake_gpus_take_their_device_nodes_from_the_template() -> None:
    d = with_fake_nodes(fake_gpus(2), "/dev/gf{index}")
    assert [g.device_nodes for g in d.gpus] == [("/dev/gf0",), ("/dev/gf1",)]
    assert with_fake_nodes(fake_gpus(1), None).gpus[0].device_nodes == ()


def test_mig_capability_nodes_come_from_procfs(tmp_path: Path) -> None:
    gi = tmp_path / "gpu3" / "mig" / "gi2"
    (gi / "ci0").mkdir(parents=True)
    (gi / "access").write_text("DeviceFileMinor: 21\nDeviceFileMode: 292\n")
    (gi / "ci0" / "access").write_text("DeviceFileMinor: 22\n")
    assert mig_nodes(3, 2, 0, caps=CapsTree(proc=tmp_path)) == (
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    )
    assert mig_nodes(3, 9, 0, caps=CapsTree(proc=tmp_path)) == ()


def test_discovery_names_each_gpus_device_node_by_its_minor_number() -> None:
    from gpufence.control.gpus.devices import DeviceMap
    from gpufence.control.gpus.discovery import discover, node_spec
    from gpufence.model.decisions import Assignment
    from gpufence.spec.build import cluster_from_dict
    from gpufence.testing.fake_nvml import FakeNvml, hgx_h100

    d = discover(FakeNvml(hgx_h100(4)))
    assert [g.device_nodes for g in d.gpus] == [(f"/dev/nvidia{i}",) for i in range(4)]
    cluster = cluster_from_dict(node_spec(d))
    gpus = tuple(sorted(cluster.nodes[0].gpu_ids))
    nodes = DeviceMap(cluster, d).nodes(Assignment(node=0, gpus=gpus[1:3]))
    assert nodes == ("/dev/nvidia1", "/dev/nvidia2")
