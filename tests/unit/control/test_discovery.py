"""GPU discovery: an in-memory NVML drives discover(); node_spec() loads through the spec loader."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufence.control import discovery as disc
from gpufence.control import nodespec
from gpufence.control.discovery import (
    DiscoveredGpu,
    Discovery,
    DiscoveryError,
    MigDevice,
    NvmlError,
    catalogue_type,
    discover,
    fake_gpus,
    node_spec,
)
from gpufence.control.nodespec import nvlink_domain_sizes
from gpufence.control.nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_NOT_FOUND,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
)
from gpufence.model.partition import SharingMode
from gpufence.spec import cluster_from_dict, load_cluster_text

GIB = 1 << 30
SWITCH = "00000000:c1:00.0"  # an NVSwitch: a remote end that is none of the GPUs

# -- fake NVML ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mem:
    total: int


@dataclass(frozen=True)
class Pci:
    busId: str


@dataclass(frozen=True)
class Placement:
    start: int
    size: int


@dataclass(frozen=True)
class GiInfo:
    profileId: int
    placement: Placement


@dataclass(frozen=True)
class Attrs:
    gpuInstanceSliceCount: int
    memorySizeMB: int


@dataclass(frozen=True)
class FakeMig:
    uuid: str
    gi_id: int
    profile_id: int
    start: int
    size: int  # memory slices
    slices: int  # compute slices of the GPU instance
    mem_mb: int


@dataclass
class FakeGpu:
    name: str
    memory_mib: int
    bus: str
    mig_mode: tuple[int, int] | None = None  # None: MIG not supported
    migs: list[FakeMig] = field(default_factory=list)
    links: dict[int, str] | None = None  # active link -> remote bus; None: NVLink unsupported
    n_links: int = 12


@dataclass(frozen=True)
class Handle:
    gpu: int
    mig: int | None = None


@dataclass(frozen=True)
class GiHandle:
    gpu: int
    gi_id: int


def err(code: int) -> NvmlError:
    return NvmlError(code, f"NVML error {code}")


class FakeNvml:
    """Implements discovery.NvmlApi over in-memory GPUs."""

    def __init__(
        self,
        gpus: Sequence[FakeGpu],
        *,
        init_error: int | None = None,
        gi_permission: bool = True,
        fail_on: str | None = None,
    ) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.gi_permission = gi_permission
        self.fail_on = fail_on
        self.calls: list[str] = []

    def _gpu(self, h: object) -> FakeGpu:
        assert isinstance(h, Handle)
        return self.gpus[h.gpu]

    def _mig(self, h: object) -> FakeMig:
        assert isinstance(h, Handle) and h.mig is not None
        return self.gpus[h.gpu].migs[h.mig]

    def _log(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_on:
            raise err(NVML_ERROR_GPU_NOT_FOUND)

    def nvmlInit(self) -> None:
        self._log("nvmlInit")
        if self.init_error is not None:
            raise err(self.init_error)

    def nvmlShutdown(self) -> None:
        self._log("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "535.104.05"

    def nvmlSystemGetNVMLVersion(self) -> bytes:
        return b"12.535.104.05"  # some pynvml versions give bytes

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        return Handle(index)

    def nvmlDeviceGetName(self, handle: object) -> bytes:
        return self._gpu(handle).name.encode()

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        if isinstance(handle, Handle) and handle.mig is not None:
            return self._mig(handle).uuid
        return f"GPU-{self._gpu(handle).bus}"

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> Mem:
        self._log("nvmlDeviceGetMemoryInfo")
        return Mem(self._gpu(handle).memory_mib << 20)

    def nvmlDeviceGetPciInfo(self, handle: object) -> Pci:
        return Pci(self._gpu(handle).bus)

    def nvmlDeviceGetMigMode(self, handle: object) -> list[int]:
        mode = self._gpu(handle).mig_mode
        if mode is None:
            raise err(NVML_ERROR_NOT_SUPPORTED)
        return list(mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, index: int) -> Handle:
        assert isinstance(handle, Handle)
        if index >= len(self._gpu(handle).migs):
            raise err(NVML_ERROR_NOT_FOUND)
        return Handle(handle.gpu, index)

    def nvmlDeviceGetGpuInstanceId(self, mig_handle: object) -> int:
        return self._mig(mig_handle).gi_id

    def nvmlDeviceGetGpuInstanceById(self, handle: object, gi_id: int) -> GiHandle:
        if not self.gi_permission:
            raise err(NVML_ERROR_NO_PERMISSION)
        assert isinstance(handle, Handle)
        return GiHandle(handle.gpu, gi_id)

    def nvmlGpuInstanceGetInfo(self, gpu_instance: object) -> GiInfo:
        assert isinstance(gpu_instance, GiHandle)
        m = next(m for m in self.gpus[gpu_instance.gpu].migs if m.gi_id == gpu_instance.gi_id)
        return GiInfo(m.profile_id, Placement(m.start, m.size))

    def nvmlDeviceGetAttributes(self, mig_handle: object) -> Attrs:
        m = self._mig(mig_handle)
        return Attrs(m.slices, m.mem_mb)

    def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int:
        g = self._gpu(handle)
        if g.links is None:
            raise err(NVML_ERROR_NOT_SUPPORTED)
        if link >= g.n_links:
            raise err(NVML_ERROR_INVALID_ARGUMENT)
        return 1 if link in g.links else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: object, link: int) -> Pci:
        links = self._gpu(handle).links
        assert links is not None and link in links
        return Pci(links[link])


def bus(i: int) -> str:
    return f"00000000:{0x10 + i:02x}:00.0"


def a100_box() -> list[FakeGpu]:
    """4 x A100-80GB: NVLink pairs 0-1 and 2-3; GPU 3 in MIG mode with two instances."""
    gpus = [FakeGpu("NVIDIA A100-SXM4-80GB", 81920, bus(i), mig_mode=(0, 0)) for i in range(4)]
    # Two links per pair, both directions; the remote bus is spelled without the long domain
    # on one side, as drivers have done.
    gpus[0].links = {0: bus(1), 1: bus(1)}
    gpus[1].links = {0: "0000:10:00.0", 1: bus(0)}
    gpus[2].links = {0: bus(3)}
    gpus[3].links = {0: bus(2)}
    gpus[3].mig_mode = (1, 1)
    gpus[3].migs = [
        FakeMig("MIG-bbbb", gi_id=5, profile_id=14, start=4, size=2, slices=2, mem_mb=19968),
        FakeMig("MIG-aaaa", gi_id=1, profile_id=9, start=0, size=4, slices=3, mem_mb=40192),
    ]
    return gpus


def hgx_h100(n: int = 8) -> list[FakeGpu]:
    """NVSwitch board: every GPU's links end on switches, never on another GPU."""
    return [
        FakeGpu(
            "NVIDIA H100 80GB HBM3",
            81559,
            bus(i),
            mig_mode=(0, 0),
            links={k: SWITCH for k in range(18)},
            n_links=18,
        )
        for i in range(n)
    ]


def load(spec: dict[str, Any]) -> Any:
    return cluster_from_dict(spec, source="discovered GPUs")


# -- discover() --------------------------------------------------------------------------------


def test_discover_mig_and_nvlink_pairs() -> None:
    nvml = FakeNvml(a100_box())
    d = discover(nvml)
    assert not d.fake
    assert d.driver == "535.104.05"
    assert d.source.startswith("NVML 12.535.104.05 (driver 535.104.05): 4 GPUs: ")
    assert "4 x NVIDIA A100-SXM4-80GB (A100-80GB)" in d.source
    assert "MIG enabled on GPU 3" in d.source
    assert [g.index for g in d.gpus] == [0, 1, 2, 3]
    assert {g.gpu_type for g in d.gpus} == {"A100-80GB"}
    assert d.gpus[0].memory_mib == 81920
    assert d.gpus[0].uuid == f"GPU-{bus(0)}"
    assert d.gpus[0].model == "NVIDIA A100-SXM4-80GB"
    assert [g.nvlink_peers for g in d.gpus] == [(1,), (0,), (3,), (2,)]
    assert all(g.nvlink_reported for g in d.gpus)
    assert [g.mig_enabled for g in d.gpus] == [False, False, False, True]
    # GI profile 14 is 2g.20gb and 9 is 3g.40gb on A100-80GB; sorted by placement start.
    assert d.gpus[3].mig_devices == (
        MigDevice("MIG-aaaa", "3g.40gb", 0),
        MigDevice("MIG-bbbb", "2g.20gb", 4),
    )
    assert d.gpus[0].mig_devices == ()
    assert nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"


def test_node_spec_loads_with_mig_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    monkeypatch.setattr(nodespec, "host_memory_gib", lambda: 251)
    spec = node_spec(discover(FakeNvml(a100_box())), "box")
    group = spec["node_groups"][0]
    assert group == {
        "name": "box",
        "count": 1,
        "gpus_per_node": 4,
        "gpu_type": "A100-80GB",
        "nvlink_domains": [2, 2],
        "cpu_cores": 32,
        "memory_gib": 251,
    }
    assert spec["partitions"]["shared"]["gpus"] == ["box:0-2"]
    assert spec["partitions"]["mig"]["mig"] == {
        "layout": ["3g.40gb@0", "2g.20gb@4"],
        "dynamic": False,
    }
    cluster = load(spec)
    assert len(cluster.gpus) == 4 and len(cluster.nodes) == 1
    node = cluster.nodes[0]
    assert node.name == "box-0" and node.gpu_type == "A100-80GB"
    assert node.nvlink_domains == ((0, 1), (2, 3))
    assert node.cpu_milli == 32_000 and node.mem_mib == 251 * 1024
    assert [g.partition for g in cluster.gpus] == ["shared", "shared", "shared", "mig"]
    shared, mig = cluster.partitions["shared"], cluster.partitions["mig"]
    assert shared.sharing is SharingMode.EXCLUSIVE and len(shared.admits) == 4
    assert mig.sharing is SharingMode.MIG and mig.mig is not None
    assert mig.mig.layout == ("3g.40gb@0", "2g.20gb@4")
    # The dict is plain data: it round-trips through YAML into the same cluster.
    assert load_cluster_text(yaml.safe_dump(spec, sort_keys=False)) == cluster


def test_nvswitch_board_is_one_domain_and_one_partition() -> None:
    d = discover(FakeNvml(hgx_h100()))
    assert {g.gpu_type for g in d.gpus} == {"H100-80GB"}
    assert d.gpus[0].nvlink_peers == (1, 2, 3, 4, 5, 6, 7)
    spec = node_spec(d)
    assert spec["node_groups"][0]["nvlink_domains"] == [8]
    assert list(spec["partitions"]) == ["shared"]
    assert spec["partitions"]["shared"] == {
        "nodes": ["local"],
        "admits": ["serving", "training", "interactive", "batch"],
        "sharing": "exclusive",
        "backfill": True,
    }
    cluster = load(spec)
    assert len(cluster.gpus) == 8
    assert {g.gpu_type for g in cluster.gpus} == {"H100-80GB"}
    assert cluster.nodes[0].nvlink_domains == (tuple(range(8)),)


def test_not_supported_nvlink_and_mig_mean_unknown() -> None:
    # PCIe L40S: NVML answers NotSupported for NVLink state and MIG mode.
    gpus = [FakeGpu("NVIDIA L40S", 46068, bus(i)) for i in range(2)]
    d = discover(FakeNvml(gpus))
    assert [g.gpu_type for g in d.gpus] == ["L40S-48GB", "L40S-48GB"]
    assert all(not g.mig_enabled and not g.nvlink_reported for g in d.gpus)
    assert all(g.nvlink_peers == () for g in d.gpus)
    spec = node_spec(d)
    assert spec["node_groups"][0]["nvlink_domains"] == [2]  # unknown: the spec's default
    assert len(load(spec).gpus) == 2


def test_links_reported_but_inactive_give_one_domain_per_gpu() -> None:
    gpus = [FakeGpu("NVIDIA A100-SXM4-40GB", 40960, bus(i), links={}) for i in range(3)]
    d = discover(FakeNvml(gpus))
    assert {g.gpu_type for g in d.gpus} == {"A100-40GB"}
    assert all(g.nvlink_reported and g.nvlink_peers == () for g in d.gpus)
    assert node_spec(d)["node_groups"][0]["nvlink_domains"] == [1, 1, 1]


def test_non_consecutive_components_split_into_runs() -> None:
    # {0, 2} and {1, 3} are linked: no consecutive run stays inside one component.
    gpus = [FakeGpu("NVIDIA A100-SXM4-80GB", 81920, bus(i), links={}) for i in range(6)]
    gpus[0].links = {0: bus(2)}
    gpus[1].links = {0: bus(3)}
    gpus[4].links = {0: bus(5)}
    d = discover(FakeNvml(gpus))
    assert d.gpus[2].nvlink_peers == (0,)  # links count both ways
    assert nvlink_domain_sizes(d.gpus) == [1, 1, 1, 1, 2]
    assert load(node_spec(d)).nodes[0].nvlink_domains == ((0,), (1,), (2,), (3,), (4, 5))


def test_mig_without_gpu_instance_permission_uses_attributes() -> None:
    nvml = FakeNvml(a100_box(), gi_permission=False)
    d = discover(nvml)
    assert d.gpus[3].mig_devices == (
        MigDevice("MIG-bbbb", "2g.20gb", None),
        MigDevice("MIG-aaaa", "3g.40gb", None),
    )
    spec = node_spec(d)
    assert spec["partitions"]["mig"]["mig"]["layout"] == ["2g.20gb", "3g.40gb"]
    assert load(spec).partitions["mig"].mig is not None


def test_compute_instances_of_one_gpu_instance_are_listed_once() -> None:
    gpus = a100_box()
    gpus[3].migs = [
        FakeMig("MIG-c0", gi_id=1, profile_id=9, start=0, size=4, slices=3, mem_mb=40192),
        FakeMig("MIG-c1", gi_id=1, profile_id=9, start=0, size=4, slices=3, mem_mb=40192),
    ]
    d = discover(FakeNvml(gpus))
    assert len(d.gpus[3].mig_devices) == 2
    assert node_spec(d)["partitions"]["mig"]["mig"]["layout"] == ["3g.40gb@0"]


def test_distinct_mig_layouts_get_one_partition_each() -> None:
    gpus = a100_box()
    gpus[2].mig_mode = (1, 1)
    gpus[2].migs = [
        FakeMig("MIG-7g", gi_id=0, profile_id=0, start=0, size=8, slices=7, mem_mb=80640)
    ]
    spec = node_spec(discover(FakeNvml(gpus)))
    assert list(spec["partitions"]) == ["shared", "mig-1", "mig-2"]
    assert spec["partitions"]["shared"]["gpus"] == ["local:0-1"]
    assert spec["partitions"]["mig-1"]["gpus"] == ["local:2"]
    assert spec["partitions"]["mig-1"]["mig"]["layout"] == ["7g.80gb@0"]
    cluster = load(spec)
    assert [g.partition for g in cluster.gpus] == ["shared", "shared", "mig-1", "mig-2"]


def test_mig_enabled_without_instances_is_refused() -> None:
    gpus = a100_box()
    gpus[3].migs = []
    d = discover(FakeNvml(gpus))
    with pytest.raises(DiscoveryError, match=r"GPU 3 has MIG enabled but no MIG instances"):
        node_spec(d)


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1"),
        (NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (NVML_ERROR_NO_PERMISSION, "no permission"),
        (999, "NVML did not start"),
    ],
)
def test_init_failure_says_why_and_what_to_do(code: int, words: str) -> None:
    nvml = FakeNvml(hgx_h100(), init_error=code)
    with pytest.raises(DiscoveryError) as info:
        discover(nvml)
    assert words in str(info.value)
    assert "--fake-gpus" in str(info.value) and "--config" in str(info.value)
    assert "nvmlShutdown" not in nvml.calls  # never initialised, so nothing to shut down


def test_no_gpu_is_an_error() -> None:
    nvml = FakeNvml([])
    with pytest.raises(DiscoveryError, match=r"sees no GPU.*--fake-gpus"):
        discover(nvml)
    assert nvml.calls[-1] == "nvmlShutdown"


def test_query_failure_names_the_gpu_and_still_shuts_down() -> None:
    nvml = FakeNvml(hgx_h100(2), fail_on="nvmlDeviceGetMemoryInfo")
    with pytest.raises(DiscoveryError, match=r"failed on GPU 0: NVML"):
        discover(nvml)
    assert nvml.calls[-1] == "nvmlShutdown"


def test_missing_bindings_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with pytest.raises(DiscoveryError, match=r"pip install nvidia-ml-py.*--fake-gpus"):
        discover()


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


@pytest.mark.parametrize("n", [0, -2])
def test_fake_gpus_count_is_checked(n: int) -> None:
    with pytest.raises(DiscoveryError, match=r"--fake-gpus needs a number of GPUs of at least 1"):
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


# -- the real thing ----------------------------------------------------------------------------


def _nvml_unavailable() -> str | None:
    """Why the real NVML cannot be used here, or None when it can."""
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError:
        return "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"NVML does not start on this machine (no NVIDIA driver/GPU): {exc}"
    try:
        if pynvml.nvmlDeviceGetCount() < 1:
            return "NVML sees no GPU on this machine"
    finally:
        pynvml.nvmlShutdown()
    return None


def test_real_discover_on_this_machine() -> None:
    reason = _nvml_unavailable()
    if reason is not None:
        pytest.skip(f"real GPU discovery not possible: {reason}")
    d = discover()
    assert not d.fake and d.driver and d.gpus
    assert d.source.startswith("NVML ")
    assert all(g.uuid.startswith("GPU-") and g.memory_mib > 0 for g in d.gpus)
    try:
        spec = node_spec(d)
    except DiscoveryError as exc:  # mixed GPUs, odd MIG states: a --config machine
        pytest.skip(f"this machine needs a --config file: {exc}")
    cluster = load(spec)
    assert len(cluster.gpus) == len(d.gpus)
