"""GPU discovery through NVML: an in-memory NVML drives discover(), then node_spec() loads it.

The last test runs discover() against the real NVML when this machine has one.
"""

from __future__ import annotations

import sys

import pytest
import yaml

from gpufence.control.gpus import nodespec
from gpufence.control.gpus.discovery import DiscoveryError, MigDevice, discover, node_spec
from gpufence.control.gpus.nodespec import nvlink_domain_sizes
from gpufence.control.gpus.nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
)
from gpufence.model.partition import SharingMode
from gpufence.spec import load_cluster_text
from gpufence.testing.fake_nvml import FakeGpu, FakeMig, FakeNvml, a100_box, bus, hgx_h100, load

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
    monkeypatch.setattr(nodespec, "host_cpu_cores", lambda: 32)
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
