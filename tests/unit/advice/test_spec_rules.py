"""Spec rules, table-driven: for every rule one spec that triggers it and one that does not.

Each case is a small cluster file (YAML, through the real loader) plus the numbers a scenario or
the history would give (peak, SLO, gang); the assertion is the exact set of rules that fire and
the field path of the rule under test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from gpufence.advice import catalog
from gpufence.advice.advise import LIVE_RULES
from gpufence.advice.inputs import GangInput, LintInputs, ServingPeak, SloInput
from gpufence.advice.lint import SPEC_RULES, lint_cluster
from gpufence.spec import load_cluster_text

# two racks of two 8-GPU nodes: a-0, a-1 (rack-a), b-0, b-1 (rack-b)
GROUPS = [
    {"name": "a", "count": 2, "gpus_per_node": 8, "gpu_type": "H100-80GB", "rack": "rack-a"},
    {"name": "b", "count": 2, "gpus_per_node": 8, "gpu_type": "H100-80GB", "rack": "rack-b"},
]
SERVING = {"nodes": ["a"], "admits": ["serving"]}  # 16 GPUs, rack-a
TRAINING = {"nodes": ["b"], "admits": ["training"]}  # 16 GPUs, rack-b


def spec(partitions: dict[str, Any], queues: list[dict[str, Any]] | None = None) -> str:
    doc: dict[str, Any] = {"name": "t", "node_groups": GROUPS, "partitions": partitions}
    if queues:
        doc["queues"] = queues
    return yaml.safe_dump(doc, sort_keys=False)


def with_(base: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**base, **fields}


@dataclass
class Case:
    rule: str
    fires: str  # a spec that triggers the rule
    clean: str  # a spec that does not
    path: str  # the field path the advice points at
    inputs: LintInputs = field(default_factory=LintInputs)


MIG = {"sharing": "mig", "mig": {"layout": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}}
INCIDENT = {"mode": "incident-only", "from": ["training"], "budget": 2}
SLO_60 = {"p99_ms": 200, "window_s": 60}
# training's gangs capped at its own 16 GPUs (so lending to it does not admit bigger ones)
CAPPED = [{"name": "t", "partition": "training", "nominal_gpus": 16, "borrowing_limit_gpus": 0}]

CASES = [
    Case(  # the newcomer: notebooks on the serving partition
        catalog.SERVING_SHARES_PARTITION,
        spec({"serving": with_(SERVING, admits=["serving", "interactive"]), "training": TRAINING}),
        spec(
            {
                "serving": {"nodes": ["a[0]"], "admits": ["serving"]},
                "notebooks": {"nodes": ["a[1]"], "admits": ["interactive"]},
                "training": TRAINING,
            }
        ),
        "partitions.serving.admits",
    ),
    Case(
        catalog.MIG_NOT_A_FENCE,
        spec(
            {
                "shared": {"nodes": ["a"], "admits": ["serving", "interactive"], **MIG},
                "training": TRAINING,
            }
        ),
        spec(
            {
                "serving": {"nodes": ["a[0]"], "admits": ["serving"]},
                "notebooks": {"nodes": ["a[1]"], "admits": ["interactive"], **MIG},
                "training": TRAINING,
            }
        ),
        "partitions.shared.sharing",
    ),
    Case(  # 16 GPUs, peak 12 + one node (8) = 20; the clean spec's serving has all four nodes
        catalog.SERVING_NO_FAILURE_MARGIN,
        spec({"serving": SERVING, "training": TRAINING}),
        spec(
            {
                "serving": {"nodes": ["a", "b[0]"], "admits": ["serving"]},
                "training": {"nodes": ["b[1]"], "admits": ["training"]},
            }
        ),
        "partitions.serving",
        LintInputs(peaks=(ServingPeak("serving", 12, "test"),)),
    ),
    Case(
        catalog.LENDING_RECLAIM_SLOW,
        spec(
            {
                "serving": with_(
                    SERVING,
                    slo=SLO_60,
                    lending=[{"to": ["training"], "cap_gpus": 8, "reclaim_deadline_s": 120}],
                ),
                "training": TRAINING,
            },
            CAPPED,
        ),
        spec(
            {
                "serving": with_(
                    SERVING,
                    slo=SLO_60,
                    lending=[{"to": ["training"], "cap_gpus": 8, "reclaim_deadline_s": 30}],
                ),
                "training": TRAINING,
            },
            CAPPED,
        ),
        "partitions.serving.lending[0].reclaim_deadline_s",
    ),
    Case(  # training may run a 24-GPU gang on its 16 + 8 lent GPUs; the clean one caps it by quota
        catalog.GANG_EXCEEDS_CAPACITY,
        spec(
            {
                "serving": with_(
                    SERVING, lending=[{"to": ["training"], "cap_gpus": 8, "reclaim_deadline_s": 30}]
                ),
                "training": TRAINING,
            }
        ),
        spec(
            {
                "serving": with_(
                    SERVING, lending=[{"to": ["training"], "cap_gpus": 8, "reclaim_deadline_s": 30}]
                ),
                "training": TRAINING,
            },
            [
                {
                    "name": "research",
                    "partition": "training",
                    "nominal_gpus": 16,
                    "borrowing_limit_gpus": 0,
                }
            ],
        ),
        "partitions.training",
    ),
    Case(  # the workload brings 32-GPU gangs to a 16-GPU partition (rejected at submit)
        catalog.GANG_EXCEEDS_CAPACITY,
        spec({"serving": SERVING, "training": TRAINING}),
        spec(
            {
                "serving": {"nodes": ["a[0]"], "admits": ["serving"]},
                "training": {"nodes": ["a[1]", "b"], "admits": ["training"]},
            }
        ),
        "partitions.training",
        LintInputs(gangs=(GangInput("training", 24, "test"),)),
    ),
    Case(  # contractual SLO, 24-GPU training (75% of 32) sharing rack-a with serving
        catalog.WRONG_SHAPE,
        spec(
            {
                "serving": {
                    "nodes": ["a[0]"],
                    "admits": ["serving"],
                    "slo": {"p99_ms": 200, "contractual": True},
                },
                "training": {"nodes": ["a[1]", "b"], "admits": ["training"]},
            }
        ),
        spec(  # the same cluster with an internal (not contractual) SLO
            {
                "serving": {
                    "nodes": ["a[0]"],
                    "admits": ["serving"],
                    "slo": {"p99_ms": 200, "contractual": False},
                },
                "training": {"nodes": ["a[1]", "b"], "admits": ["training"]},
            }
        ),
        "partitions.serving",
        LintInputs(gangs=(GangInput("training", 24, "test"),)),
    ),
    Case(
        catalog.PREEMPTS_NON_CHECKPOINTABLE,
        spec(
            {
                "serving": with_(SERVING, preemption={"mode": "on-demand", "from": ["training"]}),
                "training": TRAINING,
            }
        ),
        spec({"serving": with_(SERVING, preemption=INCIDENT), "training": TRAINING}),
        "partitions.serving.preemption.mode",
    ),
    Case(
        catalog.PREEMPTS_NON_CHECKPOINTABLE,
        spec(
            {
                "serving": with_(
                    SERVING,
                    lending=[
                        {
                            "to": ["training"],
                            "cap_gpus": 4,
                            "reclaim_deadline_s": 30,
                            "checkpointable_only": False,
                        }
                    ],
                ),
                "training": {"nodes": ["b"], "admits": ["training"]},
            },
            [{"name": "t", "partition": "training", "nominal_gpus": 16, "borrowing_limit_gpus": 0}],
        ),
        spec(
            {
                "serving": with_(
                    SERVING, lending=[{"to": ["training"], "cap_gpus": 4, "reclaim_deadline_s": 30}]
                ),
                "training": {"nodes": ["b"], "admits": ["training"]},
            },
            [{"name": "t", "partition": "training", "nominal_gpus": 16, "borrowing_limit_gpus": 0}],
        ),
        "partitions.serving.lending[0].checkpointable_only",
    ),
    Case(  # 8 + 8 = all 16 GPUs promised, and b may borrow all of a's quota
        catalog.QUOTA_BORROW_UNBOUNDED,
        spec(
            {"serving": SERVING, "training": TRAINING},
            [
                {
                    "name": "a",
                    "partition": "training",
                    "nominal_gpus": 8,
                    "borrowing_limit_gpus": 4,
                },
                {"name": "b", "partition": "training", "nominal_gpus": 8},
            ],
        ),
        spec(
            {"serving": SERVING, "training": TRAINING},
            [
                {
                    "name": "a",
                    "partition": "training",
                    "nominal_gpus": 8,
                    "borrowing_limit_gpus": 4,
                },
                {
                    "name": "b",
                    "partition": "training",
                    "nominal_gpus": 8,
                    "borrowing_limit_gpus": 4,
                },
            ],
        ),
        "queues[1].borrowing_limit_gpus",
        LintInputs(queue_index={"a": 0, "b": 1}),
    ),
]


def _ids(case: Case) -> str:
    return case.rule + ("-with-inputs" if case.inputs != LintInputs() else "")


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_rule_fires_on_its_spec_and_not_on_the_clean_one(case: Case) -> None:
    fired = lint_cluster(load_cluster_text(case.fires), case.inputs)
    assert [a.rule for a in fired] == [case.rule], [a.summary for a in fired]
    (advice,) = fired
    assert advice.where == case.path
    assert advice.why and advice.fix and advice.evidence["summary"]
    assert lint_cluster(load_cluster_text(case.clean), case.inputs) == []


def test_every_rule_has_a_case_and_the_catalogue_matches_the_code() -> None:
    assert set(SPEC_RULES) == set(catalog.SPEC_RULES)
    assert set(LIVE_RULES) == set(catalog.LIVE_RULES)
    assert {c.rule for c in CASES} == set(catalog.SPEC_RULES)


def test_rules_needing_numbers_stay_quiet_without_them() -> None:
    """No peak, no SLO, no gang size: the margin, lending-deadline and wrong-shape rules cannot
    judge, so they say nothing (rather than guess)."""
    fires = {c.rule: c for c in CASES}
    for rule in (catalog.SERVING_NO_FAILURE_MARGIN,):
        assert lint_cluster(load_cluster_text(fires[rule].fires)) == []
    lends = spec(
        {
            "serving": with_(
                SERVING, lending=[{"to": ["training"], "cap_gpus": 8, "reclaim_deadline_s": 120}]
            ),
            "training": TRAINING,
        },
        [{"name": "r", "partition": "training", "nominal_gpus": 16, "borrowing_limit_gpus": 0}],
    )
    assert lint_cluster(load_cluster_text(lends)) == []
    # ... and a scenario's SLO (judged every 60 s) makes the lending rule fire
    slo = LintInputs(slos=(SloInput("serving", 250, 60, False, "scenario"),))
    assert [a.rule for a in lint_cluster(load_cluster_text(lends), slo)] == [
        catalog.LENDING_RECLAIM_SLOW
    ]


def test_the_newcomer_is_told_why_and_how_to_fix_it() -> None:
    """A serving partition that admits notebooks: the seed's reason, and a spec change that
    gives notebooks their own partition with idle reclaim."""
    text = spec(
        {"serving": with_(SERVING, admits=["serving", "interactive"]), "training": TRAINING}
    )
    (a,) = lint_cluster(load_cluster_text(text))
    assert "Interactive notebooks should not sit on the serving partition" in a.why
    assert "Admit only serving in serving" in a.fix and "interactive" in a.fix
    assert "-     admits: [serving, interactive]" in a.diff
    assert "+     admits: [serving]" in a.diff
    assert "+   interactive:" in a.diff and "+     nodes: [a[1]]" not in a.diff
    assert '+     nodes: ["a[1]"]' in a.diff and "reclaim:" in a.diff
    # the suggested spec is valid and no longer advised against
    fixed = spec(
        {
            "serving": {"nodes": ["a[0]"], "admits": ["serving"]},
            "interactive": {
                "nodes": ["a[1]"],
                "admits": ["interactive"],
                "sharing": "exclusive",
                "reclaim": {"idle_threshold": 0.05, "idle_after_s": 1800},
            },
            "training": TRAINING,
        }
    )
    assert lint_cluster(load_cluster_text(fixed)) == []


def test_ignored_rules_are_not_reported() -> None:
    case = CASES[0]
    assert lint_cluster(load_cluster_text(case.fires), LintInputs(ignore=(case.rule,))) == []


def test_margin_fix_grows_serving_by_whole_nodes_from_training() -> None:
    case = next(c for c in CASES if c.rule == catalog.SERVING_NO_FAILURE_MARGIN)
    (a,) = lint_cluster(load_cluster_text(case.fires), case.inputs)
    assert a.evidence["needed_gpus"] == 20 and a.evidence["recommended_gpus"] == 24
    assert "Grow serving to 24 GPUs (taking 8 from training)" in a.fix
    assert '+     nodes: [a, "b[0]"]' in a.diff and '+     nodes: ["b[1]"]' in a.diff


def test_wrong_shape_is_about_the_fence_not_the_sizes() -> None:
    """A contractual SLO beside a 24-of-32-GPU gang is fine on hardware of its own; lending
    serving's GPUs to training breaks that fence again."""
    groups = [
        {"name": "s", "count": 1, "gpus_per_node": 8, "gpu_type": "H100-80GB", "rack": "r1"},
        {"name": "t", "count": 3, "gpus_per_node": 8, "gpu_type": "H100-80GB", "rack": "r2"},
    ]
    serving: dict[str, Any] = {
        "nodes": ["s"],
        "admits": ["serving"],
        "slo": {"p99_ms": 200, "contractual": True},
    }
    doc = {
        "name": "t",
        "node_groups": groups,
        "partitions": {"serving": serving, "training": {"nodes": ["t"], "admits": ["training"]}},
    }
    gang = LintInputs(gangs=(GangInput("training", 24, "test"),))
    assert lint_cluster(load_cluster_text(yaml.safe_dump(doc)), gang) == []
    serving["lending"] = [{"to": ["training"], "cap_gpus": 8, "reclaim_deadline_s": 30}]
    fired = lint_cluster(load_cluster_text(yaml.safe_dump(doc)), gang)
    shape = next(a for a in fired if a.rule == catalog.WRONG_SHAPE)
    assert shape.evidence["gang_fraction"] == 0.75 and shape.evidence["lends_gpus"] == 8
    assert "move training bursts larger than 16 GPUs" in shape.fix
    assert "-     lending: [{to: [training], cap_gpus: 8, reclaim_deadline_s: 30}]" in shape.diff
