"""Live rules, table-driven: for every rule a history that triggers it and one that does not.

Histories are written by hand (jobs, attempts, notices and stops on a clock in seconds) over
small clusters; the assertions name the rules that fire and the numbers of the evidence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest
import yaml

from gpufence.advice import catalog
from gpufence.advice.advise import advise
from gpufence.advice.history import (
    ENDED_BY_CANCEL,
    ENDED_BY_ITSELF,
    AttemptSpan,
    History,
    JobSpan,
    Mark,
)
from gpufence.advice.inputs import AdviceSettings, ChronicPreemption
from gpufence.model.cluster import Cluster
from gpufence.spec import load_cluster_text

DAY = 86400.0
H = 3600.0

ONE_NODE = {
    "name": "fenced",
    "node_groups": [{"name": "local", "count": 1, "gpus_per_node": 8, "gpu_type": "H100-80GB"}],
    "partitions": {
        "serving": {
            "gpus": ["local:0-1"],
            "admits": ["serving"],
            "preemption": {"mode": "incident-only", "from": ["training"], "budget": 8},
        },
        "training": {"gpus": ["local:2-5"], "admits": ["training"]},
        "interactive": {
            "gpus": ["local:6-7"],
            "admits": ["interactive"],
            "reclaim": {"idle_after_s": 1800, "warning_s": 300},
        },
    },
}
LENDING = yaml.safe_load(yaml.safe_dump(ONE_NODE))
LENDING["partitions"]["serving"]["lending"] = [
    {"to": ["training"], "cap_gpus": 2, "reclaim_deadline_s": 30}
]
FOUR_NODES = {
    "name": "four",
    "node_groups": [{"name": "n", "count": 4, "gpus_per_node": 8, "gpu_type": "H100-80GB"}],
    "partitions": {"training": {"nodes": ["n"], "admits": ["training", "interactive"]}},
}


def cluster(doc: dict[str, Any]) -> Cluster:
    return load_cluster_text(yaml.safe_dump(doc))


def job(
    jid: str, cls: str, part: str, gpus: float, t0: float, t1: float | None, **kw: Any
) -> JobSpan:
    fields: dict[str, Any] = {
        "tenant": "team",
        "replicas": 1,
        "per_replica": int(gpus) or 1,
        "state": "running" if t1 is None else "done",
        "ended_by": "" if t1 is None else ENDED_BY_ITSELF,
    }
    fields.update(kw)
    return JobSpan(
        jid, workload_class=cls, partition=part, gpus=gpus, submitted=t0, ended=t1, **fields
    )


def run(
    jid: str, part: str, gids: tuple[int, ...], t0: float, t1: float | None, **kw: Any
) -> AttemptSpan:
    return AttemptSpan(
        jid,
        kw.pop("attempt", 1),
        part,
        kw.pop("lent_from", None),
        gids,
        float(len(gids)),
        t0,
        t1,
        **kw,
    )


def history(
    now: float,
    jobs: list[JobSpan],
    attempts: Sequence[AttemptSpan] = (),
    marks: Sequence[Mark] = (),
    start: float = 0.0,
) -> History:
    return History(start, now, tuple(jobs), tuple(attempts), tuple(marks), "test", wall_clock=False)


# ---------------------------------------------------------------- the cases


def preempted_on(days: list[float]) -> History:
    """Serving: 2 replicas always, plus a 2-replica surge at each time in ``days`` that
    preempts the training gang (incident preemption)."""
    now = 7 * DAY
    jobs = [
        job("s1", "serving", "serving", 1, 0, None),
        job("s2", "serving", "serving", 1, 0, None),
        job(
            "gang",
            "training",
            "training",
            4,
            0,
            None,
            replicas=2,
            per_replica=2,
            checkpointable=True,
        ),
    ]
    marks = []
    for k, t in enumerate(days):
        jobs += [
            job(f"surge{k}a", "serving", "serving", 1, t, t + 600),
            job(f"surge{k}b", "serving", "serving", 1, t, t + 600),
        ]
        marks.append(Mark(t + 5, "gang", "stop", "incident-preemption"))
    return history(now, jobs, marks=marks)


def batch_eval(slo: float | None, ended_by: str) -> History:
    j = job("eval", "serving", "serving", 1, 0, 2 * H, slo_p99_ms=slo, ended_by=ended_by)
    return history(3 * H, [j], [run("eval", "serving", (0,), 60, 2 * H)])


def sessions(withdrawn: int, reclaim: bool) -> tuple[Cluster, History]:
    doc = yaml.safe_load(yaml.safe_dump(ONE_NODE))
    if not reclaim:
        del doc["partitions"]["interactive"]["reclaim"]
    nb = job("nb", "interactive", "interactive", 1, 0, 5 * H if not reclaim else 3 * H)
    marks = [
        Mark(2000.0 + k * 2500, "nb", "notice-withdrawn", "active-again") for k in range(withdrawn)
    ]
    held = run("nb", "interactive", (6,), 0, nb.ended)
    return cluster(doc), history(6 * H, [nb], [held], marks)


def borrowers(acked: bool) -> History:
    """Four borrowers of serving's idle GPU 0, each reclaimed after an hour when a serving
    replica (of two) comes back."""
    jobs, atts = [], []
    for k in range(4):
        t = k * 2 * H
        jobs.append(job(f"b{k}", "training", "training", 1, t, t + H, checkpointable=True))
        atts.append(
            run(
                f"b{k}",
                "serving",
                (0,),
                t,
                t + H,
                lent_from="serving",
                stop_reason="lent-reclaim",
                acked=acked,
            )
        )
        for g in (0, 1):
            jobs.append(
                job(
                    f"s{k}{g}",
                    "serving",
                    "serving",
                    1,
                    t + H,
                    t + 1.5 * H,
                    ended_by=ENDED_BY_CANCEL,
                    state="cancelled",
                )
            )
            atts.append(run(f"s{k}{g}", "serving", (g,), t + H, t + 1.5 * H))
    return history(8 * H, jobs, atts)


def scattered(per_node: int, packed: bool = False) -> History:
    """1-GPU jobs for an hour, ``per_node`` on each of the four nodes (or all on the first
    nodes when ``packed``), and a 2 x 8 gang waiting through that hour."""
    n = 4 * per_node
    gids = list(range(n)) if packed else [k * 8 + i for k in range(4) for i in range(per_node)]
    jobs = [job(f"small{g}", "training", "training", 1, 0, H) for g in gids]
    atts = [run(f"small{g}", "training", (g,), 0, H) for g in gids]
    jobs.append(job("gang", "training", "training", 16, 0, 2 * H, replicas=2, per_replica=8))
    atts.append(run("gang", "training", tuple(range(16, 32)), H, 2 * H))
    return history(2 * H, jobs, atts)


@dataclass
class Case:
    rule: str
    fires: Callable[[], tuple[Cluster, History]]
    clean: Callable[[], tuple[Cluster, History]]


def _on(doc: dict[str, Any], h: Callable[[], History]) -> Callable[[], tuple[Cluster, History]]:
    return lambda: (cluster(doc), h())


CASES = [
    Case(
        catalog.CHRONIC_PREEMPTION,
        _on(ONE_NODE, lambda: preempted_on([1 * DAY, 3 * DAY, 5 * DAY])),
        _on(ONE_NODE, lambda: preempted_on([5 * DAY, 5 * DAY + 60, 5 * DAY + 120])),
    ),
    Case(
        catalog.BATCH_IN_SERVING,
        _on(ONE_NODE, lambda: batch_eval(None, ENDED_BY_ITSELF)),
        _on(ONE_NODE, lambda: batch_eval(250.0, ENDED_BY_ITSELF)),
    ),
    Case(
        catalog.BATCH_IN_SERVING,  # a replica scaled down (cancelled) is not batch
        _on(ONE_NODE, lambda: batch_eval(None, ENDED_BY_ITSELF)),
        _on(ONE_NODE, lambda: batch_eval(None, ENDED_BY_CANCEL)),
    ),
    Case(
        catalog.IDLE_INTERACTIVE,
        lambda: sessions(0, reclaim=False),
        lambda: sessions(0, reclaim=True),
    ),
    Case(
        catalog.IDLE_INTERACTIVE,
        lambda: sessions(4, reclaim=True),
        lambda: sessions(1, reclaim=True),
    ),
    Case(
        catalog.LENDING_LOSES_WORK,
        _on(LENDING, lambda: borrowers(acked=False)),
        _on(LENDING, lambda: borrowers(acked=True)),
    ),
    Case(  # 24 GPUs free, 6 on each node; packed: three whole nodes free
        catalog.FRAGMENTATION_STRANDING,
        _on(FOUR_NODES, lambda: scattered(2)),
        _on(FOUR_NODES, lambda: scattered(2, packed=True)),
    ),
    Case(  # 16 free, 4 on each node: just what the gang needs, its nodes are draining
        catalog.FRAGMENTATION_STRANDING,
        _on(FOUR_NODES, lambda: scattered(2)),
        _on(FOUR_NODES, lambda: scattered(4)),
    ),
]


def _live(c: Cluster, h: History, settings: AdviceSettings | None = None) -> list[str]:
    return [a.rule for a in advise(c, h, settings) if a.rule in catalog.LIVE_RULES]


@pytest.mark.parametrize("case", CASES, ids=[c.rule for c in CASES])
def test_rule_fires_on_its_history_and_not_on_the_clean_one(case: Case) -> None:
    assert _live(*case.fires()) == [case.rule]
    assert _live(*case.clean()) == []


def test_every_live_rule_has_a_case() -> None:
    assert {c.rule for c in CASES} == set(catalog.LIVE_RULES)


def test_chronic_preemption_names_the_size_and_the_cost() -> None:
    c, h = cluster(ONE_NODE), preempted_on([1 * DAY, 3 * DAY, 5 * DAY])
    (a,) = [x for x in advise(c, h) if x.rule == catalog.CHRONIC_PREEMPTION]
    ev = a.evidence
    assert (ev["preemptions"], ev["periods_with_preemptions"], ev["periods_seen"]) == (3, 3, 7)
    assert ev["peak_serving_gpus"] == 4 and ev["recommended_gpus"] == 4  # one node: no margin
    assert ev["victims"] == ["gang"]
    assert "Grow the serving reserve serving from 2 to 4 GPUs" in a.fix
    assert "training goes from 4 to 2 GPUs" in a.fix and "gang with 4 GPUs" in a.fix
    assert '+     gpus: ["local:0-3"]' in a.diff and '+     gpus: ["local:4-5"]' in a.diff
    # the margin rule would say the same from the same peak: it is folded into this advice
    assert [x.rule for x in advise(c, h)] == [catalog.CHRONIC_PREEMPTION]


def test_chronic_preemption_threshold_is_configurable_and_scales_with_a_short_history() -> None:
    c, h = cluster(ONE_NODE), preempted_on([1 * DAY, 3 * DAY, 5 * DAY])
    strict = AdviceSettings(chronic_preemption=ChronicPreemption(more_than=3, of_last=7))
    assert _live(c, h, strict) == []
    # two days of history with preemptions on both: more than a scaled bar of 1 of 2
    young = replace(preempted_on([0.5 * DAY, 1.5 * DAY]), now=2 * DAY)
    assert _live(c, young) == [catalog.CHRONIC_PREEMPTION]
    assert _live(c, replace(preempted_on([1.5 * DAY]), now=2 * DAY)) == []


def test_a_tenant_sees_only_advice_about_its_own_jobs() -> None:
    c = cluster(ONE_NODE)
    mine = batch_eval(None, ENDED_BY_ITSELF)
    theirs = replace(mine, jobs=tuple(replace(j, tenant="other") for j in mine.jobs))
    chronic = preempted_on([1 * DAY, 3 * DAY, 5 * DAY])
    both = replace(chronic, jobs=chronic.jobs + theirs.jobs, attempts=theirs.attempts)
    assert [a.rule for a in advise(c, both, tenant="other")] == [catalog.BATCH_IN_SERVING]
    assert advise(c, both, tenant="team") == []  # its gang was preempted: cluster advice, hidden
    assert {a.rule for a in advise(c, both)} == {
        catalog.CHRONIC_PREEMPTION,
        catalog.BATCH_IN_SERVING,
    }


def test_lending_loss_names_the_ratio_and_the_fix() -> None:
    (a,) = advise(cluster(LENDING), borrowers(acked=False))
    assert a.evidence["loss_ratio"] == 1.0 and a.evidence["reclaims"] == 4
    assert a.evidence["lent_gpu_hours"] == 4.0 and a.evidence["lost_gpu_hours"] == 4.0
    # serving used both its GPUs whenever it came back: nothing is reliably idle
    assert "Stop lending from serving: its own work used up to 2 of its 2 GPUs" in a.fix
    assert a.diff.splitlines()[-1].startswith("-     lending: [{to: [training], cap_gpus: 2")


def test_fragmentation_names_free_gpus_and_the_largest_block() -> None:
    (a,) = advise(cluster(FOUR_NODES), scattered(2))
    assert a.evidence["most_free_gpus"] == 24 and a.evidence["largest_free_block"] == 6
    assert a.evidence["stranded_s"] == H and a.evidence["jobs"] == ["gang"]
