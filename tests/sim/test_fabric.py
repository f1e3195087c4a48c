"""The ring all-reduce fabric model against hand-computed cases.

Setup: H100s with 900 GB/s NVLink (450 GB/s per direction), 400 Gbit/s node uplinks
(50 GB/s), a 16-GPU gang (2 nodes x 8) all-reducing S = 10 GB after 1 s of compute:
D = 2(n−1)/n·S = 18.75 GB through every link its ring crosses, α-terms 2(n−1)·15 µs = 0.45 ms.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from gpufence.model.decisions import Assignment
from gpufence.model.hardware import Fabric as FabricSpec
from gpufence.model.hardware import GpuType
from gpufence.sim.contention import burst_exposure
from gpufence.sim.fabric import Fabric
from gpufence.sim.workloads.records import CommSpec
from gpufence.state.ledger import Allocation
from gpufence.testing.builders import ClusterBuilder, job

SPEC = CommSpec(allreduce_gb=10.0, compute_s=1.0)
D = 2 * 15 / 16 * 10e9
NODE_BW = 400e9 / 8
ALPHA = 2 * 15 * 15e-6
ALONE = 1.0 + ALPHA + D / NODE_BW  # 1.37545 s: the node uplink is the bottleneck


def cluster(racks: int, nodes_per_rack: int, rack_gbps: float):  # type: ignore[no-untyped-def]
    b = ClusterBuilder()
    for r in range(racks):
        b.nodes(f"r{r}", nodes_per_rack, gpus=8, rack=f"rack{r}")
    b.partition("p", [f"r{r}" for r in range(racks)])
    c = b.build()
    h100 = GpuType("H100-80GB", 80.0, mig_model="H100-80GB", nvlink_gbps=7200)
    return replace(
        c,
        gpu_types={**c.gpu_types, "H100-80GB": h100},
        fabric=FabricSpec(node_uplink_gbps=400, rack_uplink_gbps=rack_gbps),
    )


def gang(name: str, c, nodes: list[int]) -> Allocation:  # type: ignore[no-untyped-def]
    asg = tuple(Assignment(n, c.nodes[n].gpu_ids) for n in nodes)
    j = job(name).gang(len(nodes), gpus=8).build()
    return Allocation(j, "p", "p", "p", asg, 8000 * len(nodes))


def test_a_lone_gang_is_not_slowed_by_its_own_traffic() -> None:
    c = cluster(1, 2, rack_gbps=3200)
    f = Fabric(c)
    assert f.add(gang("g", c, [0, 1]), SPEC) == {"g"}
    assert f.gangs["g"].iter_s == pytest.approx(ALONE)
    assert f.factor("g") == pytest.approx(1.0)
    # its ring keeps each node uplink busy D / t of the time, and each GPU's NVLink less
    assert f.utilization("node:r0-0") == pytest.approx(D / ALONE / NODE_BW)  # 0.2726
    assert f.utilization("nvlink:r0-0") == pytest.approx(D / ALONE / 450e9)


def test_an_oversubscribed_rack_uplink_slows_a_lone_cross_rack_gang() -> None:
    c = cluster(2, 1, rack_gbps=200)  # 25 GB/s rack uplinks, below the node uplinks
    f = Fabric(c)
    f.add(gang("g", c, [0, 1]), SPEC)
    assert f.factor("g") == pytest.approx((1.0 + ALPHA + D / 25e9) / ALONE)  # 1.2726


def test_two_gangs_sharing_rack_uplinks_and_the_release() -> None:
    """Each gets what the other leaves: t = a + D / (B − D/t) (share above the fair 1/2),
    i.e. B t² − (2D + aB) t + aD = 0."""
    c = cluster(2, 2, rack_gbps=400)  # rack uplink = node uplink = 50 GB/s
    f = Fabric(c)
    f.add(gang("g1", c, [0, 2]), SPEC)  # node 0 in rack0, node 2 in rack1
    changed = f.add(gang("g2", c, [1, 3]), SPEC)
    assert changed == {"g1", "g2"}
    a, b = 1.0 + ALPHA, NODE_BW
    t = ((2 * D + a * b) + math.sqrt((2 * D + a * b) ** 2 - 4 * b * a * D)) / (2 * b)
    assert t == pytest.approx(1.5004, abs=1e-4)
    for g in ("g1", "g2"):
        assert f.gangs[g].iter_s == pytest.approx(t, rel=2e-3)
        assert f.factor(g) == pytest.approx(t / ALONE, rel=2e-3)  # 1.091
    assert f.remove("g2") == {"g1"}
    assert f.factor("g1") == pytest.approx(1.0)
    assert "rack:rack0" in f.load and f.gangs_on("rack:rack0") == 1


def test_a_ring_crosses_the_rack_uplink_once_not_the_bisection() -> None:
    """64 GPUs, 32/32 over two racks: the rack uplink carries D per iteration like each node
    uplink (a bisection bound would charge it 32 GPUs' worth: 4x a ring's crossing)."""
    c = cluster(2, 4, rack_gbps=12800)
    f = Fabric(c)
    f.add(gang("g", c, list(range(8))), SPEC)
    assert f.load["rack:rack0"] == pytest.approx(f.load["node:r0-0"])
    assert f.factor("g") == pytest.approx(1.0)


def test_a_single_node_gang_uses_nvlink_only() -> None:
    c = cluster(1, 1, rack_gbps=3200)
    f = Fabric(c)
    f.add(gang("g", c, [0]), SPEC)
    assert set(f.load) == {"nvlink:r0-0"}
    assert f.factor("g") == pytest.approx(1.0)
    assert f.gangs["g"].iter_s == pytest.approx(1.0 + 2 * 7 * 5e-6 + (2 * 7 / 8 * 10e9) / 450e9)


def test_serving_burst_exposure() -> None:
    """Busy half the time, a quarter of the request moving data at half speed: E[s] = 1.125,
    extra c_s² = U(1−U)f²/E[s]²."""
    e = burst_exposure(0.5, 0.25)
    assert e.mean_factor == pytest.approx(1.125)
    assert e.extra_cv2 == pytest.approx(0.25 * 0.0625 / 1.125**2)
    assert burst_exposure(0.0, 0.25).mean_factor == 1.0
