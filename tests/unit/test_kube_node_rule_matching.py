"""A pod's node constraint read as GPU types (kube/node_rules.py): Kubernetes' matching rules
and the three outcomes -- no constraint, GPU types, refused -- as exact values."""

from __future__ import annotations

import pytest

from gpufence.kube.node_rules import GpuNodeFacts, NodeRule, Requirement, gpu_types_for, matches

NODES = {
    "h1": GpuNodeFacts({"zone": "a", "gen": "9", "os": "linux"}, "H100-80GB"),
    "h2": GpuNodeFacts({"zone": "b", "gen": "9", "os": "linux"}, "H100-80GB"),
    "a1": GpuNodeFacts({"zone": "a", "gen": "8", "os": "linux", "old": ""}, "A100-80GB"),
}


def term(*reqs: Requirement) -> NodeRule:
    return NodeRule((), (reqs,))


MATCH_CASES = [
    (NodeRule((("zone", "a"),)), {"h1", "a1"}),
    (term(Requirement("zone", "In", ("b", "c"))), {"h2"}),
    (term(Requirement("zone", "NotIn", ("b",))), {"h1", "a1"}),
    (term(Requirement("old", "Exists")), {"a1"}),
    (term(Requirement("old", "DoesNotExist")), {"h1", "h2"}),
    (term(Requirement("gen", "Gt", ("8",))), {"h1", "h2"}),
    (term(Requirement("gen", "Lt", ("9",))), {"a1"}),
    (term(Requirement("gen", "Gt", ("x",))), set()),  # not an integer: matches nothing
    (term(Requirement("metadata.name", "In", ("h2",), field=True)), {"h2"}),
    (NodeRule((), ((), (Requirement("zone", "In", ("b",)),))), {"h2"}),  # empty term: none
    (
        NodeRule((("zone", "a"),), ((Requirement("gen", "In", ("9",)),),)),
        {"h1"},
    ),  # the selector and a term, both
]


@pytest.mark.parametrize(("rule", "want"), MATCH_CASES)
def test_node_rule_matches_as_kubernetes_does(rule: NodeRule, want: set[str]) -> None:
    assert {n for n, f in NODES.items() if matches(rule, n, f.labels)} == want


def test_a_rule_every_gpu_node_meets_constrains_nothing() -> None:
    assert gpu_types_for(NodeRule((("os", "linux"),)), NODES) == ()
    assert gpu_types_for(NodeRule(), NODES) == ()


def test_a_rule_that_selects_whole_gpu_types_becomes_those_types() -> None:
    assert gpu_types_for(term(Requirement("gen", "In", ("9",))), NODES) == ("H100-80GB",)
    assert gpu_types_for(term(Requirement("old", "Exists")), NODES) == ("A100-80GB",)


def test_a_rule_cutting_across_a_type_is_refused_naming_it() -> None:
    with pytest.raises(ValueError) as e:
        gpu_types_for(NodeRule((("zone", "a"),)), NODES)
    assert str(e.value).startswith(
        "spec.nodeSelector zone=a selects 2 of the 3 GPU nodes, not whole GPU types "
        "(it leaves out h2 of type A100-80GB, H100-80GB)"
    )


def test_a_rule_selecting_no_gpu_node_is_refused() -> None:
    with pytest.raises(ValueError, match="selects none of the 3 GPU nodes"):
        gpu_types_for(term(Requirement("zone", "In", ("z",))), NODES)
