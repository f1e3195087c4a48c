"""Golden test: the Tiresias 60-job gang trace replayed to a checked-in decision log.

Regenerate after an intended behaviour change with ``GPUFENCE_UPDATE_GOLDEN=1 pytest tests/golden``
and review the diff like code.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpufence.sim.runner import Simulation
from gpufence.sim.summary import decision_line
from gpufence.sim.workloads.tiresias import load_tiresias
from gpufence.spec import cluster_from_dict

HERE = Path(__file__).parent
CLUSTER = {
    "name": "golden-12",
    "node_groups": [
        {"name": "a", "count": 2, "gpus_per_node": 4, "gpu_type": "H100-80GB", "rack": "r0"},
        {"name": "b", "count": 1, "gpus_per_node": 4, "gpu_type": "H100-80GB", "rack": "r1"},
    ],
    "partitions": {"train": {"nodes": ["a", "b"], "admits": ["training"]}},
}


def _replay(with_estimates: bool) -> list[str]:
    cluster = cluster_from_dict(CLUSTER)
    work = load_tiresias(HERE / "tiresias_60_job.csv", 4, with_estimates=with_estimates)
    result = Simulation(cluster, work).run()
    assert result.invariant_violations == 0
    assert all(t.state == "done" for t in result.jobs.values())
    return [decision_line(t, d) for t, d in result.log]


def _check(name: str, lines: list[str]) -> None:
    path = HERE / name
    text = "\n".join(lines) + "\n"
    if os.environ.get("GPUFENCE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with GPUFENCE_UPDATE_GOLDEN=1 once"
    assert text == path.read_text()


def test_tiresias_60_without_estimates_matches_golden_log() -> None:
    _check("tiresias60_no_estimates.log", _replay(False))


def test_tiresias_60_with_estimates_matches_golden_log() -> None:
    _check("tiresias60_estimates.log", _replay(True))


def test_replay_is_deterministic() -> None:
    assert _replay(True) == _replay(True)
