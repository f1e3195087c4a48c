"""Ray nodes as gpufence nodes (``gpufence.control.executors.ray.nodes``): no Ray needed."""

from __future__ import annotations

from typing import Any

import pytest

from gpufence.control.base.config import cluster_from_spec_dict
from gpufence.control.executors.ray.bookkeeping import node_changes
from gpufence.control.executors.ray.nodes import (
    RayNodesError,
    auto_names,
    cluster_spec,
    match_config,
    parse,
)


def _raw(node_id: str, gpus: int, alive: bool = True, **res: float) -> dict[str, Any]:
    resources = {"CPU": 8.0, "memory": 64.0 * 2**30, **res}
    if gpus:
        resources["GPU"] = float(gpus)
    return {
        "NodeID": node_id,
        "Alive": alive,
        "NodeManagerAddress": "10.0.0.1",
        "Resources": resources,
        "Labels": {},
    }


def test_cluster_spec_from_ray_nodes() -> None:
    nodes = parse(
        [
            _raw("aa" * 28, 8, **{"rack:rack-a": 1.0, "gpufence_gpu_type:A100-80GB": 1.0}),
            _raw("bb" * 28, 4, **{"gpufence_rack_rack-b": 1.0, "gpufence_node:gpu-b": 1.0}),
            _raw("cc" * 28, 0),  # a head without GPUs
            _raw("dd" * 28, 8, alive=False),
        ]
    )
    spec = cluster_spec(nodes)
    groups = {g["name"]: g for g in spec["node_groups"]}
    assert set(groups) == {"ray-aaaaaaaa", "gpu-b"}
    assert groups["ray-aaaaaaaa"]["gpu_type"] == "A100-80GB"
    assert groups["ray-aaaaaaaa"]["rack"] == "rack-a"
    assert groups["gpu-b"] == {
        **groups["gpu-b"],
        "gpus_per_node": 4,
        "rack": "rack-b",
        "gpu_type": "H100-80GB",
    }
    cluster = cluster_from_spec_dict(spec)
    assert sorted(n.name for n in cluster.nodes) == ["gpu-b-0", "ray-aaaaaaaa-0"]
    assert set(auto_names(nodes)) == {"gpu-b-0", "ray-aaaaaaaa-0"}
    assert list(cluster.partitions) == ["shared"]


def test_config_nodes_are_matched_by_label() -> None:
    spec = {
        "name": "c",
        "node_groups": [{"name": "a", "count": 2, "gpus_per_node": 4, "gpu_type": "H100-80GB"}],
        "partitions": {"p": {"nodes": ["a"], "admits": ["training"]}},
    }
    cluster = cluster_from_spec_dict(spec)
    one = _raw("aa" * 28, 4, **{"gpufence_node:a-0": 1.0})
    with pytest.raises(RayNodesError, match="a-1"):
        match_config(cluster, parse([one]))
    two = _raw("bb" * 28, 4, **{"gpufence_node:a-1": 1.0})
    got = match_config(cluster, parse([one, two]))
    assert {k: v.node_id[:2] for k, v in got.items()} == {"a-0": "aa", "a-1": "bb"}


def test_node_changes() -> None:
    first = parse([_raw("aa" * 28, 4, **{"gpufence_node:x": 1.0})])
    nodes, up = {"x-0": first[0]}, {"x-0": True}
    assert node_changes(nodes, up, first) == []
    dead = parse([_raw("aa" * 28, 4, alive=False, **{"gpufence_node:x": 1.0})])
    assert node_changes(nodes, up, dead) == [("x-0", False, "aa" * 28)]
    back = parse([_raw("ee" * 28, 4, **{"gpufence_node:x": 1.0})])  # restarted: new id
    assert node_changes(nodes, up, back) == [("x-0", True, "aa" * 28)]
    assert nodes["x-0"].node_id == "ee" * 28 and up["x-0"]
