"""Cluster spec layer: examples load, selectors round-trip, every mistake is named by its path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufence.model.job import WorkloadClass
from gpufence.model.partition import PreemptionMode, SharingMode
from gpufence.spec import (
    ClusterSchema,
    SpecError,
    cluster_from_dict,
    format_spec_error,
    load_cluster,
    load_cluster_text,
    parse_gpu_selector,
    parse_node_selector,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

BASE = """\
name: base
node_groups:
  - {name: h100-a, count: 2, gpus_per_node: 8, gpu_type: H100-80GB, rack: rack-a}
  - {name: h100-b, count: 2, gpus_per_node: 8, gpu_type: H100-80GB, rack: rack-b}
  - {name: l40s, count: 1, gpus_per_node: 4, gpu_type: L40S-48GB, rack: rack-b}
partitions:
  serving:
    nodes: [h100-a]
    admits: [serving]
    lending: [{to: [training], cap_gpus: 8}]
    preemption: {mode: incident-only, from: [training], budget: 4}
  training:
    nodes: ["h100-b[1]"]
    gpus: ["h100-b[0]:0-3"]
    admits: [training]
  interactive:
    gpus: ["h100-b[0]:4-7"]
    admits: [interactive]
    sharing: mig
    mig: {layout: ["3g.40gb", "2g.20gb", "1g.10gb@6"]}
    reclaim: {}
  batch:
    nodes: [l40s]
    admits: [batch]
    sharing: time-slice
    time_slice_max: 4
queues:
  - {name: research, partition: training, weight: 2, nominal_gpus: 8}
  - {name: product, partition: training, nominal_gpus: 4}
"""


def edited(edits: dict[str, Any]) -> dict[str, Any]:
    """BASE with {"partitions.serving.lending[0].to": value} edits; None deletes, [len] appends."""
    doc: dict[str, Any] = yaml.safe_load(BASE)
    for dotted, value in edits.items():
        parts = re.findall(r"[^.\[\]]+|\[\d+\]", dotted)
        keys: list[Any] = [int(p[1:-1]) if p.startswith("[") else p for p in parts]
        cur: Any = doc
        for k in keys[:-1]:
            cur = cur[k]
        if value is None:
            del cur[keys[-1]]
        elif isinstance(cur, list) and keys[-1] == len(cur):
            cur.append(value)
        else:
            cur[keys[-1]] = value
    return doc


def errors_of(doc: object) -> list[str]:
    with pytest.raises(SpecError) as info:
        cluster_from_dict(doc)
    return info.value.errors


# -- examples and the happy path ----------------------------------------------------------------


def test_base_spec_builds() -> None:
    c = cluster_from_dict(edited({}))
    assert list(c.partitions) == ["serving", "training", "interactive", "batch"]  # YAML order
    assert {p: len(g) for p, g in c.partition_gpus.items()} == {
        "serving": 16, "training": 12, "interactive": 4, "batch": 4,
    }  # fmt: skip
    assert [g.gid for g in c.gpus] == list(range(36))
    b0 = c.nodes[c.node_by_name["h100-b-0"]]
    assert [c.gpus[g].partition for g in b0.gpu_ids] == ["training"] * 4 + ["interactive"] * 4
    assert all(c.gpus[g].node == b0.idx and c.gpus[g].index == k for k, g in enumerate(b0.gpu_ids))
    assert c.partitions["interactive"].mig is not None
    assert c.partitions["interactive"].mig.layout == ("3g.40gb", "2g.20gb", "1g.10gb@6")
    assert c.partitions["batch"].time_slice_max == 4
    assert c.partitions["training"].mig is None and c.partitions["training"].time_slice_max == 1
    assert set(c.gpu_types) == {"H100-80GB", "L40S-48GB"}
    assert c.queues["research"].nominal_milli == 8000 and c.queues["research"].tenant == "research"
    # partitions without declared queues get one named after them
    assert c.queues["serving"].partition == "serving" and c.partition_queues["batch"] == ("batch",)
    assert c.racks == ("rack-a", "rack-b")
    assert "partitions" in ClusterSchema.model_json_schema()["properties"]  # for editors / docs


def test_single_node_example() -> None:
    c = load_cluster(EXAMPLES / "single-node-8gpu.yaml")
    assert len(c.nodes) == 1 and len(c.gpus) == 8
    (p,) = c.partitions.values()
    assert p.admits == frozenset(WorkloadClass) - {WorkloadClass.SERVING}
    assert p.sharing is SharingMode.EXCLUSIVE
    assert len(c.partition_gpus[p.name]) == 8


def test_mixed_64_example() -> None:
    c = load_cluster(EXAMPLES / "mixed-64.yaml")
    assert len(c.gpus) == 64 and len(c.racks) == 2
    gpus = {p: len(g) for p, g in c.partition_gpus.items()}
    assert gpus == {"serving": 16, "training": 32, "interactive": 8, "batch": 8}
    serving = c.partitions["serving"]
    assert serving.lending[0].to == ("training",) and serving.lending[0].cap_gpus == 8
    assert serving.lending[0].reclaim_deadline_s == 45
    assert serving.preemption.mode is PreemptionMode.INCIDENT_ONLY
    assert serving.preemption.budget == 4 and serving.preemption.from_partitions == ("training",)
    assert {c.nodes[n].rack for n in c.partition_nodes["serving"]} == {"rack-a", "rack-b"}
    assert c.queues["research"].weight == 2 and c.queues["research"].nominal_milli == 20_000
    assert c.queues["product"].nominal_milli == 12_000
    assert c.partitions["interactive"].sharing is SharingMode.MIG
    assert c.partitions["interactive"].reclaim is not None
    assert c.partitions["batch"].placement == "fgd"


def test_cluster_1000_example() -> None:
    c = load_cluster(EXAMPLES / "cluster-1000.yaml")
    assert len(c.nodes) == 1000 and len(c.gpus) == 8000 and len(c.racks) == 32
    nodes = {p: len(n) for p, n in c.partition_nodes.items()}
    assert nodes == {"serving": 96, "interactive": 48, "batch": 56, "training": 800}
    mig = c.partitions["interactive"].mig
    assert mig is not None and mig.dynamic
    assert sum(c.queues[q].nominal_milli or 0 for q in c.partition_queues["training"]) == 6_400_000
    assert c.nodes[0].name == "r00-00" and c.nodes[-1].name == "r31-30"


@pytest.mark.parametrize(
    ("count", "first", "last"),
    [(1, "g-0", "g-0"), (10, "g-0", "g-9"), (11, "g-00", "g-10"), (101, "g-000", "g-100")],
)
def test_node_names_are_padded_to_the_width_of_count_minus_one(
    count: int, first: str, last: str
) -> None:
    group = {"name": "g", "count": count, "gpus_per_node": 1, "gpu_type": "T4-16GB"}
    partitions = {"p": {"nodes": ["g"], "admits": ["batch"]}}
    c = cluster_from_dict({"name": "n", "node_groups": [group], "partitions": partitions})
    assert (c.nodes[0].name, c.nodes[-1].name) == (first, last)


def test_nvlink_domains_and_host_resources() -> None:
    doc = edited({"node_groups[0].nvlink_domains": [4, 4], "node_groups[0].cpu_cores": 96})
    c = cluster_from_dict(doc)
    node = c.nodes[0]
    assert node.nvlink_domains == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert [c.gpus[g].nvlink_domain for g in node.gpu_ids] == [0] * 4 + [1] * 4
    assert node.cpu_milli == 96_000 and node.mem_mib == 512 * 1024


def test_user_gpu_type_may_reuse_a_mig_model() -> None:
    doc = edited(
        {
            "gpu_types": [{"name": "H100-NVL", "memory_gib": 94, "mig_model": "H100-80GB"}],
            "node_groups[1].gpu_type": "H100-NVL",
            "queues[0].nominal_gpus": 0.5,
        }
    )
    c = cluster_from_dict(doc)
    assert c.gpu_types["H100-NVL"].mig_model == "H100-80GB"
    assert c.queues["research"].nominal_milli == 500


def test_yaml_off_is_a_string_and_from_is_an_alias() -> None:
    text = BASE.replace("{mode: incident-only, from: [training], budget: 4}", "{mode: off}")
    c = load_cluster_text(text)
    assert c.partitions["serving"].preemption.mode is PreemptionMode.OFF


NODE_SELECTORS = ["g", "g[3]", "g[-1]", "g[2:5]", "g[:5]", "g[2:]", "g[-2:]", "rack.a_1[0:16]"]
GPU_SELECTORS = ["g:0", "g:0-7", "g[1]:2-3", "g[0:4]:7", "g[-2:]:0-1"]


@pytest.mark.parametrize("text", [*NODE_SELECTORS, *GPU_SELECTORS])
def test_selector_round_trip(text: str) -> None:
    parse = parse_gpu_selector if text in GPU_SELECTORS else parse_node_selector
    assert str(parse(text)) == text


@pytest.mark.parametrize(
    ("text", "count", "picked"),
    [("g", 4, [0, 1, 2, 3]), ("g[1]", 4, [1]), ("g[-1]", 4, [3]), ("g[1:3]", 4, [1, 2]),
     ("g[-2:]", 4, [2, 3]), ("g[:1]", 4, [0]), ("g[:]", 2, [0, 1])],
)  # fmt: skip
def test_node_selector_resolves_like_a_slice(text: str, count: int, picked: list[int]) -> None:
    assert list(parse_node_selector(text).resolve(count)) == picked


@pytest.mark.parametrize("text", ["g[]", "g[3-4]", "g[a]", "g[1:2:3]", "g x", "[1]", "g[1]x"])
def test_bad_node_selectors(text: str) -> None:
    with pytest.raises(ValueError, match="is not a node selector"):
        parse_node_selector(text)


# -- errors ------------------------------------------------------------------------------------

# (id, {dotted path: new value, ~ deletes}, a substring that one error line must contain)
ERROR_TABLE = """\
- [unknown-group, {partitions.serving.nodes: [rack-z]},
   "partitions.serving.nodes[0]: group 'rack-z' does not exist (known: h100-a, h100-b, l40s)"]
- [unknown-gpu-type, {"node_groups[1].gpu_type": H300}, "node_groups[1].gpu_type: 'H300' is not
   a known GPU type (known: A100-40GB, A100-80GB, H100-80GB, H200-141GB, V100-32GB, L40S-48GB,
   A10-24GB, T4-16GB; or declare it under gpu_types)"]
- [bad-enum, {partitions.training.sharing: exclusiv}, "partitions.training.sharing: 'exclusiv' is
   not valid (expected one of: exclusive, mig, fractional, time-slice); did you mean 'exclusive'?"]
- [unknown-field, {partitions.serving.admitz: [serving]},
   "partitions.serving.admitz: unknown field (allowed: admits, backfill, gpus, lending, "]
- [unknown-top-level-field, {fabrik: {}}, "fabrik: unknown field (allowed: fabric, "]
- [overlap-one-gpu, {partitions.interactive.gpus: ["h100-b[0]:3-7"]},
   "partitions.interactive.gpus[0]: GPU h100-b-0:3 is already in partition 'training'"]
- [overlap-range, {partitions.interactive.gpus: ["h100-b[0]:0-7"]}, "partitions.interactive.gpus[0]:
   GPUs h100-b-0:0-3 are already in partition 'training' (selected by partitions.training.gpus[0])"]
- [overlap-whole-node, {partitions.batch.nodes: [l40s, "h100-a[1]"]},
   "partitions.batch.nodes[1]: GPUs h100-a-1:0-7 are already in partition 'serving'"]
- [unfenced-gpus, {partitions.batch.nodes: ~, partitions.batch.gpus: ["l40s:0-1"]},
   "node l40s-0 GPUs 2-3 belong to no partition (add them to a partition's nodes or gpus)"]
- [unfenced-node, {partitions.training.nodes: ~}, "node h100-b-1 GPUs 0-7 belong to no partition"]
- [quota, {"queues[0].nominal_gpus": 10}, "queues[1].nominal_gpus: queues of partition 'training'
   declare 14 GPUs of nominal quota but it holds 12"]
- [mig-does-not-fit, {partitions.interactive.mig.layout: [4g.40gb, 4g.40gb]},
   "partitions.interactive.mig.layout: [4g.40gb, 4g.40gb] does not fit on one H100-80GB GPU:"]
- [mig-bad-pinned-start, {partitions.interactive.mig.layout: [3g.40gb@1]},
   "does not fit on one H100-80GB GPU: cannot place pinned 3g.40gb@1"]
- [mig-unknown-profile, {partitions.interactive.mig.layout: [3g.40gb, 3g.41gb]},
   "partitions.interactive.mig.layout[1]: '3g.41gb' is not a MIG profile of H100-80GB (valid:
   1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb); did you mean '3g.40gb'?"]
- [mig-start-syntax, {partitions.interactive.mig.layout: [1g.10gb@x]},
   "partitions.interactive.mig.layout[0]: '1g.10gb@x': expected 'profile' or 'profile@start'"]
- [mig-on-non-mig-type, {partitions.batch.sharing: mig, partitions.batch.time_slice_max: ~,
   partitions.batch.mig: {dynamic: true}}, "partitions.batch.sharing: 'mig' needs MIG-capable
   GPUs, but the partition holds L40S-48GB GPUs (MIG-capable: A100-40GB, A100-80GB, H100-80GB"]
- [mig-with-other-sharing, {partitions.training.mig: {layout: [7g.80gb]}},
   "partitions.training.mig: only applies to sharing: mig (sharing is 'exclusive')"]
- [mig-empty-static, {partitions.interactive.mig: {layout: []}}, "partitions.interactive.mig: an
   empty mig.layout with dynamic: false creates no MIG instances"]
- [mig-defrag-static, {partitions.interactive.mig: {layout: [7g.80gb], defrag_budget: 4}},
   "partitions.interactive.mig.defrag_budget: mig.defrag_budget stops jobs so that a GPU can be
   re-cut, which needs mig.dynamic: true"]
- [mig-block-missing, {partitions.interactive.mig: ~},
   "partitions.interactive.sharing: an empty mig.layout with dynamic: false"]
- [no-gpus, {partitions.extra: {admits: [batch]}}, "partitions.extra: selects no GPUs"]
- [time-slice-max-1, {partitions.batch.time_slice_max: 1},
   "partitions.batch.time_slice_max: 1 is not valid: time-slice shares a GPU among at least 2"]
- [time-slice-max-missing, {partitions.batch.time_slice_max: ~},
   "partitions.batch.time_slice_max: required with sharing: time-slice"]
- [time-slice-max-elsewhere, {partitions.training.time_slice_max: 4},
   "partitions.training.time_slice_max: only applies to sharing: time-slice"]
- [lend-to-unknown, {"partitions.serving.lending[0].to": [trainig]},
   "partitions.serving.lending[0].to[0]: partition 'trainig' does not exist (known: serving,
   training, interactive, batch); did you mean 'training'?"]
- [lend-to-itself, {"partitions.serving.lending[0].to": [serving]},
   "partitions.serving.lending[0].to[0]: partition 'serving' cannot lend to itself"]
- [lending-cap, {"partitions.serving.lending[0].cap_gpus": 17},
   "partitions.serving.lending[0].cap_gpus: 17 is more than the 16 GPUs partition 'serving' holds"]
- [preempt-unknown, {partitions.serving.preemption.from: [nope]},
   "partitions.serving.preemption.from[0]: partition 'nope' does not exist"]
- [preempt-itself, {partitions.serving.preemption.from: [serving]},
   "partitions.serving.preemption.from[0]: partition 'serving' cannot preempt from itself"]
- [preempt-budget-0, {partitions.serving.preemption.budget: 0},
   "partitions.serving.preemption.budget: 0 with mode 'incident-only' allows no preemption"]
- [preempt-from-nothing, {partitions.serving.preemption: {mode: on-demand}},
   "partitions.serving.preemption.from: mode 'on-demand' needs at least one partition"]
- [preempt-bad-mode, {partitions.serving.preemption.mode: sometimes},
   "partitions.serving.preemption.mode: 'sometimes' is not valid (expected one of: off,
   incident-only, on-demand)"]
- [reclaim-not-interactive, {partitions.training.reclaim: {}}, "partitions.training.reclaim:
   reclaims idle interactive sessions, but the partition does not admit interactive"]
- [reclaim-threshold, {partitions.interactive.reclaim: {idle_threshold: 1.5}},
   "partitions.interactive.reclaim.idle_threshold: 1.5 is not valid"]
- [nvlink-sum, {"node_groups[0].nvlink_domains": [4, 2]},
   "node_groups[0].nvlink_domains: [4, 2] sums to 6 but gpus_per_node is 8"]
- [duplicate-group, {"node_groups[3]": {name: h100-a, count: 1, gpus_per_node: 1, gpu_type: T4}},
   "node_groups[3].name: duplicate group 'h100-a' (first declared at node_groups[0])"]
- [duplicate-queue, {"queues[2]": {name: research, partition: training}},
   "queues[2].name: duplicate queue 'research' (first declared at queues[0])"]
- [queue-unknown-partition, {"queues[1].partition": trainig},
   "queues[1].partition: partition 'trainig' does not exist (known: serving, training, "]
- [queue-named-like-default, {"queues[1].name": batch},
   "queues[1].name: 'batch' is also the name of the default queue of partition 'batch'"]
- [lending-limit, {"queues[1].lending_limit_gpus": 5},
   "queues[1].lending_limit_gpus: 5 is more than the queue's nominal_gpus 4"]
- [admits-empty, {partitions.serving.admits: []}, "partitions.serving.admits: must not be empty"]
- [admits-unknown, {partitions.serving.admits: [serving, inference]}, "partitions.serving.admits[1]:
   'inference' is not valid (expected one of: serving, training, interactive, batch)"]
- [placement, {partitions.batch.placement: worst-fit}, "partitions.batch.placement: 'worst-fit' is
   not valid (expected one of: best-fit, fgd, fence-pack, random)"]
- [node-selector-syntax, {partitions.serving.nodes: ["h100-a[x]"]}, "partitions.serving.nodes[0]:
   'h100-a[x]' is not a node selector (expected GROUP, GROUP[i] or GROUP[i:j])"]
- [gpu-selector-syntax, {partitions.training.gpus: ["h100-b[0]"]},
   "partitions.training.gpus[0]: 'h100-b[0]' is not a GPU selector (expected NODESEL:a-b"]
- [node-index-range, {partitions.serving.nodes: ["h100-a[2]"]}, "partitions.serving.nodes[0]:
   'h100-a[2]': node index 2 is out of range (group 'h100-a' has 2 nodes: 0..1)"]
- [node-slice-range, {partitions.serving.nodes: ["h100-a[0:3]"]},
   "partitions.serving.nodes[0]: 'h100-a[0:3]': slice bound 3 is out of range"]
- [empty-slice, {partitions.serving.nodes: ["h100-a[1:1]"]}, "slice selects no nodes"]
- [gpu-index-range, {partitions.interactive.gpus: ["h100-b[0]:4-8"]},
   "partitions.interactive.gpus[0]: 'h100-b[0]:4-8': GPU index 8 is out of range (nodes of group
   'h100-b' have 8 GPUs: 0-7)"]
- [gpu-range-backwards, {partitions.interactive.gpus: ["h100-b[0]:7-4"]}, "GPU range 7-4 is
   backwards"]
- [missing-field, {"node_groups[0].count": ~}, "node_groups[0].count: required field is missing"]
- [non-positive, {"node_groups[0].count": 0},
   "node_groups[0].count: 0 is not valid (input should be greater than 0)"]
- [wrong-type, {"node_groups[0].count": two},
   "node_groups[0].count: 'two' is not valid (expected a whole number)"]
- [wrong-container, {node_groups: {name: x}}, "node_groups: {'name': 'x'} is not valid (expected
   a list)"]
- [bad-name, {"node_groups[0].name": h100 a},
   "node_groups[0].name: 'h100 a' is not a valid value (use letters, digits"]
- [bad-mig-model, {gpu_types: [{name: X, memory_gib: 8, mig_model: H300}]},
   "gpu_types[0].mig_model: 'H300' is not a MIG model (expected one of: A100-40GB, "]
- [type-shadows-built-in, {gpu_types: [{name: H100-80GB, memory_gib: 80}]},
   "gpu_types[0].name: 'H100-80GB' is built in; use it without declaring it"]
"""
ERROR_CASES = [pytest.param(e, x, id=i) for i, e, x in yaml.safe_load(ERROR_TABLE)]


@pytest.mark.parametrize(("edits", "expected"), ERROR_CASES)
def test_error_line_names_path_value_and_fix(edits: dict[str, Any], expected: str) -> None:
    errors = errors_of(edited(edits))
    assert any(expected in line for line in errors), "\n".join(errors)


def test_all_problems_are_collected_even_past_schema_errors() -> None:
    doc = edited(
        {
            "partitions.serving.sharing": "exclusiv",  # schema error in serving ...
            "partitions.training.nodes": ["h100-z"],  # ... cross-field error elsewhere
            "partitions.interactive.gpus": ["h100-a[0]:0"],  # overlap with the broken serving
            "queues[1].partition": "nope",
        }
    )
    errors = errors_of(doc)
    for expected in (
        "partitions.serving.sharing: 'exclusiv' is not valid",
        "partitions.training.nodes[0]: group 'h100-z' does not exist",
        "partitions.interactive.gpus[0]: GPU h100-a-0:0 is already in partition 'serving'",
        "queues[1].partition: partition 'nope' does not exist",
    ):
        assert any(expected in line for line in errors), "\n".join(errors)


# -- YAML files ----------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def test_errors_point_at_source_lines(tmp_path: Path) -> None:
    path = write(tmp_path, BASE.replace("nodes: [h100-a]", "nodes: [rack-z]"))
    with pytest.raises(SpecError) as info:
        load_cluster(path)
    report = format_spec_error(info.value)
    assert report.splitlines()[0] == f"error: cluster spec {str(path)!r} has 3 problems:"
    assert f"{path}:8: partitions.serving.nodes[0]: group 'rack-z' does not exist" in report
    assert f"{path}:3: node h100-a-0 GPUs 0-7 belong to no partition" in report


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: [\n", "YAML syntax error at line 2, column 1"),
        ("name: a\n  b: c\n", "YAML syntax error at line 2, column 4"),
        (BASE + "name: again\n", "name: duplicate key (first at line 1); YAML keeps only the last"),
        ("", "a cluster spec must be a mapping with name, node_groups and partitions; got an"),
        ("- a\n", "must be a mapping with name, node_groups and partitions; got a list"),
    ],
)
def test_yaml_problems(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(SpecError) as info:
        load_cluster(write(tmp_path, text))
    assert any(expected in line for line in info.value.errors), info.value.errors


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "x.yaml"
    with pytest.raises(SpecError) as info:
        load_cluster(missing)
    assert info.value.errors == [f"cluster file {str(missing)!r} not found"]
    assert isinstance(info.value, ValueError) and str(info.value) == info.value.errors[0]
    assert "Traceback" not in format_spec_error(info.value)
