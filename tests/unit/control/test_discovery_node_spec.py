"""GPU types and node specs: catalogue names, unknown and mixed models, --fake-gpus, host memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufence.control.gpus import discovery as disc
from gpufence.control.gpus import nodespec
from gpufence.control.gpus.discovery import (
    DiscoveredGpu,
    Discovery,
    DiscoveryError,
    MigDevice,
    catalogue_type,
    discover,
    fake_gpus,
    node_spec,
)
from gpufence.testing.fake_nvml import FakeGpu, FakeMig, FakeNvml, bus, hgx_h100, load

# -- names, types, mixed machines --------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "memory_mib", "expected"),
    [
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", 40536, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", 81920, "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA H100 PCIe", 81559, "H100-80GB"),
        ("NVIDIA H100 NVL", 95830, None),  # 94 GB part: other MIG profiles
        ("NVIDIA H200", 143771, "H200-141GB"),
        ("NVIDIA H200 NVL", 143771, "H200-141GB"),
        ("Tesla V100-SXM2-32GB", 32768, "V100-32GB"),
        ("Tesla V100-SXM2-16GB", 16384, None),
        ("NVIDIA L40S", 46068, "L40S-48GB"),
        ("NVIDIA L40", 46068, None),
        ("NVIDIA A10", 23028, "A10-24GB"),
        ("NVIDIA A10G", 23028, None),
        ("Tesla T4", 15360, "T4-16GB"),
        ("NVIDIA GeForce RTX 4090", 24564, None),
    ],
)
def test_catalogue_type(name: str, memory_mib: int, expected: str | None) -> None:
    assert catalogue_type(name, memory_mib) == expected


def test_unknown_model_gets_a_declared_type() -> None:
    gpus = [FakeGpu("NVIDIA GeForce RTX 4090", 24564, bus(i)) for i in range(2)]
    d = discover(FakeNvml(gpus))
    assert d.gpus[0].gpu_type is None
    assert "(not in the gpufence catalogue)" in d.source
    spec = node_spec(d)
    assert spec["gpu_types"] == [{"name": "GeForce-RTX-4090-24GB", "memory_gib": 24.0}]
    assert disc.spec_gpu_type(d.gpus[0]) == "GeForce-RTX-4090-24GB"
    cluster = load(spec)
    assert cluster.nodes[0].gpu_type == "GeForce-RTX-4090-24GB"
    assert cluster.gpu_types["GeForce-RTX-4090-24GB"].memory_gib == 24.0


def test_mig_on_an_unknown_model_is_refused() -> None:
    gpus = [FakeGpu("NVIDIA H100 NVL", 95830, bus(0), mig_mode=(1, 1))]
    gpus[0].migs = [
        FakeMig("MIG-x", gi_id=1, profile_id=19, start=0, size=1, slices=1, mem_mb=11008)
    ]
    d = discover(FakeNvml(gpus))
    assert d.gpus[0].mig_devices == (MigDevice("MIG-x", "1g.11gb", 0),)  # NVIDIA-style guess
    with pytest.raises(DiscoveryError, match=r"no MIG profiles for it.*--config"):
        node_spec(d)


def test_mixed_types_need_a_config_file() -> None:
    gpus = [*hgx_h100(2), FakeGpu("NVIDIA L40S", 46068, bus(7))]
    d = discover(FakeNvml(gpus))
    with pytest.raises(DiscoveryError) as info:
        node_spec(d)
    msg = str(info.value)
    assert "GPU 0-1: H100-80GB; GPU 2: L40S-48GB" in msg
    assert "--config FILE" in msg


def test_bad_node_name() -> None:
    with pytest.raises(DiscoveryError, match=r"node name 'my host'"):
        node_spec(fake_gpus(1), "my host")


# -- fake GPUs ---------------------------------------------------------------------------------


def test_fake_gpus_load_as_one_node() -> None:
    d = fake_gpus(8)
    assert d.fake and d.driver is None
    assert d.source == "8 FAKE H100-80GB GPUs (--fake-gpus): no real device is used"
    assert len({g.uuid for g in d.gpus}) == 8
    cluster = load(node_spec(d))
    assert len(cluster.gpus) == 8 and cluster.nodes[0].gpu_type == "H100-80GB"
    assert cluster.nodes[0].nvlink_domains == (tuple(range(8)),)


def test_fake_pcie_type_has_no_nvlink() -> None:
    d = fake_gpus(1, "T4-16GB")
    assert d.source == "1 FAKE T4-16GB GPU (--fake-gpus): no real device is used"
    assert d.gpus[0].memory_mib == 16 * 1024
    assert load(node_spec(fake_gpus(4, "T4-16GB"))).nodes[0].nvlink_domains == (
        (0,),
        (1,),
        (2,),
        (3,),
    )


@pytest.mark.parametrize("n", [0, -2, 257, 10**6])
def test_fake_gpus_count_is_checked(n: int) -> None:
    with pytest.raises(DiscoveryError, match=r"--fake-gpus needs a number of GPUs from 1 to 256"):
        fake_gpus(n)


def test_fake_gpu_type_is_checked() -> None:
    with pytest.raises(DiscoveryError) as info:
        fake_gpus(2, "H100-80G")
    msg = str(info.value)
    assert msg.startswith("--fake-gpu-type 'H100-80G' is not a built-in GPU type (valid: A100-40GB")
    assert "T4-16GB" in msg and "did you mean 'H100-80GB'?" in msg


def test_discovery_with_gaps_in_indices_is_refused() -> None:
    g = fake_gpus(2).gpus
    d = Discovery((g[0], DiscoveredGpu(**{**_fields(g[1]), "index": 5})), True, None, "test")
    with pytest.raises(DiscoveryError, match=r"not 0\.\.1"):
        node_spec(d)


def _fields(g: DiscoveredGpu) -> dict[str, Any]:
    return {name: getattr(g, name) for name in DiscoveredGpu.__dataclass_fields__}


def test_host_memory(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131891220 kB\nMemFree:  1 kB\n")
    assert nodespec.host_memory_gib(meminfo) == 125
    assert nodespec.host_memory_gib(tmp_path / "missing") is None
