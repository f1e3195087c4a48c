"""Spec diffs must be pasteable: rendered selectors select exactly the GPUs they describe, and a
grown fence takes whole nodes (or GPU ranges) the way ``gpufence size`` would."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as stg

from gpufence.advice.fence_resize import carve, grow, selectors
from gpufence.spec import load_cluster_text


def _doc(groups: list[tuple[int, int]], partitions: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {
            "name": "t",
            "node_groups": [
                {"name": f"g{i}", "count": n, "gpus_per_node": per, "gpu_type": "H100-80GB"}
                for i, (n, per) in enumerate(groups)
            ],
            "partitions": partitions,
        }
    )


@stg.composite
def cluster_and_subset(draw: stg.DrawFn) -> tuple[list[tuple[int, int]], list[bool]]:
    groups = draw(
        stg.lists(stg.tuples(stg.integers(1, 4), stg.integers(1, 8)), min_size=1, max_size=3)
    )
    total = sum(n * per for n, per in groups)
    mask = draw(stg.lists(stg.booleans(), min_size=total, max_size=total))
    if all(mask) or not any(mask):
        mask[0] = not mask[0]
    if all(mask) or not any(mask):  # one GPU in all: nothing to split
        mask = [True]
    return groups, mask


@settings(max_examples=150, deadline=None)
@given(cluster_and_subset())
def test_rendered_selectors_select_exactly_those_gpus(
    case: tuple[list[tuple[int, int]], list[bool]],
) -> None:
    groups, mask = case
    if len(mask) == 1:
        return
    every = _doc(
        groups, {"all": {"nodes": [f"g{i}" for i in range(len(groups))], "admits": ["training"]}}
    )
    c = load_cluster_text(every)
    picked = [g for g in range(len(c.gpus)) if mask[g]]
    rest = [g for g in range(len(c.gpus)) if not mask[g]]
    parts = {}
    for name, gids in (("picked", picked), ("rest", rest)):
        nodes, gpus = selectors(c, gids)
        parts[name] = {
            "admits": ["training"],
            **({"nodes": nodes} if nodes else {}),
            **({"gpus": gpus} if gpus else {}),
        }
    split = load_cluster_text(_doc(groups, parts))
    assert list(split.partition_gpus["picked"]) == picked
    assert list(split.partition_gpus["rest"]) == rest


THREE_RACKS = _doc(
    [(2, 8), (2, 8), (2, 8)],
    {
        "serving": {"nodes": ["g0[0]"], "admits": ["serving"]},
        "training": {"nodes": ["g0[1]", "g1", "g2"], "admits": ["training"]},
    },
)


def test_a_whole_node_fence_grows_by_whole_nodes() -> None:
    c = load_cluster_text(THREE_RACKS)
    change = grow(c, "serving", 10, ["training"])
    assert change is not None and change.size("serving") == 16 and change.size("training") == 32
    assert selectors(c, change.gpus["serving"]) == (["g0"], [])


def test_a_gpu_range_fence_grows_by_gpus_on_its_own_node_first() -> None:
    c = load_cluster_text(
        _doc(
            [(1, 8)],
            {
                "serving": {"gpus": ["g0:0-1"], "admits": ["serving"]},
                "training": {"gpus": ["g0:2-7"], "admits": ["training"]},
            },
        )
    )
    change = grow(c, "serving", 5, ["training"])
    assert change is not None
    assert selectors(c, change.gpus["serving"]) == ([], ["g0:0-4"])
    assert selectors(c, change.gpus["training"]) == ([], ["g0:5-7"])
    assert grow(c, "serving", 9, ["training"]) is None  # more than the machine has


def test_quotas_shrink_with_the_partition_that_gives_gpus() -> None:
    doc = yaml.safe_load(THREE_RACKS)
    doc["queues"] = [
        {"name": "a", "partition": "training", "nominal_gpus": 20},
        {"name": "b", "partition": "training", "nominal_gpus": 20},
    ]
    c = load_cluster_text(yaml.safe_dump(doc))
    change = grow(c, "serving", 16, ["training"])
    assert change is not None and dict(change.quotas) == {"a": (20.0, 16.0), "b": (20.0, 16.0)}
    assert "-   nominal_gpus: 20\n+   nominal_gpus: 16" in change.diff(c, {"a": 0, "b": 1})


def test_carve_takes_the_last_node_or_the_last_gpus() -> None:
    c = load_cluster_text(THREE_RACKS)
    change = carve(c, "training", "small", 8, "admits: [training]")
    assert selectors(c, change.gpus["small"]) == (["g2[1]"], [])
    one = load_cluster_text(_doc([(1, 8)], {"shared": {"nodes": ["g0"], "admits": ["serving"]}}))
    change = carve(one, "shared", "notebooks", 2, "admits: [interactive]")
    assert selectors(one, change.gpus["notebooks"]) == ([], ["g0:6-7"])
    assert selectors(one, change.gpus["shared"]) == ([], ["g0:0-5"])
