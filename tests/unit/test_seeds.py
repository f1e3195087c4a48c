"""Every seeded source of randomness honours its seed: the same seed gives the same draw, and
other seeds give other draws (so a source that ignored its seed, or drew from a fixed or global
generator, fails here).

Sources (grep ``random``/``Random``/``default_rng`` in ``src/``): scenario generation
(``sim.generate``: training, notebooks, batch, failures), the fractional scorers (``random``
draws per placement; ``best-fit``, ``fgd``, ``fence-pack`` break ties by a seeded node order),
the scheduler's seed reaching them and the sim's seed reaching the scheduler, the Philly runtime
bootstrap (``sample_runtimes``). The openb arrival sequence (``openb.arrivals``) is checked in
``test_openb_loader.py``, the random scorer's own draws in ``test_scoring.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from pathlib import Path

import numpy as np
import pytest

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Bind
from gpufence.model.events import JobSubmitted
from gpufence.model.partition import SharingMode
from gpufence.sched.registry import SCORERS
from gpufence.sched.scheduler import Scheduler, SchedulerConfig
from gpufence.sim.generate import generate
from gpufence.sim.policy_run import run_policy
from gpufence.sim.scenario import Batch, Failures, Scenario, load_scenario
from gpufence.sim.workloads.philly import philly_runtimes, sample_runtimes
from gpufence.spec import load_cluster
from gpufence.testing.builders import ClusterBuilder, job

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
SEEDS = range(6)


def honours_seed(draw: Callable[[int], Hashable]) -> None:
    """Same seed -> same draw; the seeds in ``SEEDS`` do not all give one draw."""
    assert draw(3) == draw(3)
    assert len({draw(s) for s in SEEDS}) > 1, "every seed gave the same draw: seed ignored?"


# ---------------------------------------------------------------------- scenario generation
def _scenario() -> tuple[Scenario, Cluster]:
    sc, _ = load_scenario(ROOT / "examples" / "scenario-mixed-64.yaml")
    cluster = load_cluster(ROOT / "examples" / "mixed-64.yaml")
    six_hours = sc.model_copy(
        update={"horizon_s": 6 * 3600.0, "failures": Failures(node_mtbf_h=20.0, repair_s=600.0)}
    )
    return six_hours, cluster


@pytest.mark.parametrize("part", ["training", "notebook", "batch", "failures"])
def test_scenario_generation_honours_the_seed_in_every_part(part: str) -> None:
    sc, cluster = _scenario()

    def draw(seed: int) -> Hashable:
        work, events = generate(sc.model_copy(update={"seed": seed}), cluster)
        if part == "failures":
            return tuple((a.time, str(a.event)) for a in events)
        cls = {"training": "training", "notebook": "interactive", "batch": "batch"}[part]
        return tuple(
            (w.job.id, w.job.submit_time, w.duration_s, w.job.replicas, w.job.request)
            for w in work
            if str(w.job.workload_class) == cls
        )

    assert draw(0), f"the scenario generates no {part}: the test would prove nothing"
    honours_seed(draw)


# ---------------------------------------------------------------------- placement
def _ties_cluster(policy: str) -> Cluster:
    """Eight identical one-GPU nodes: every node scores the same for a first pod."""
    return (
        ClusterBuilder()
        .nodes("n", 8, gpus=1, cpu_cores=8, mem_gib=64)
        .partition("frac", groups=["n"], sharing=SharingMode.FRACTIONAL, placement=policy)
        .build()
    )


@pytest.mark.parametrize("policy", sorted(SCORERS))
def test_the_scheduler_seed_reaches_the_placement_policy(policy: str) -> None:
    """``random`` draws its node; the others break the tie between equal nodes by a seeded
    node order. Either way the scheduler's seed decides where the first pod goes."""

    def draw(seed: int) -> Hashable:
        sched = Scheduler(_ties_cluster(policy), SchedulerConfig(seed=seed, validate=True))
        decisions = sched.step([JobSubmitted(job("p").fraction(300).build())], 0.0)
        (bind,) = [d for d in decisions if isinstance(d, Bind)]
        return bind.assignments

    honours_seed(draw)


# ---------------------------------------------------------------------- trace sampling
def test_philly_runtime_bootstrap_honours_the_seed() -> None:
    runtimes = philly_runtimes(FIX / "philly_runtime_sample.csv")
    honours_seed(lambda s: tuple(sample_runtimes(np.random.default_rng(s), 50, runtimes).tolist()))


def test_the_sim_seed_reaches_the_placement_policy() -> None:
    """``gpufence sim --seed N`` seeds the scheduler too: with ``--placement random`` the same
    workload lands elsewhere under another seed."""
    cluster = (
        ClusterBuilder()
        .nodes("n", 8, gpus=1, cpu_cores=8, mem_gib=64)
        .partition("batch", groups=["n"], sharing=SharingMode.FRACTIONAL, placement="random")
        .build()
    )
    base = Scenario(
        name="frac",
        horizon_s=3600.0,
        batch=Batch(jobs_per_hour=30.0, gpu_fraction=0.25, partition="batch"),
    )
    work, events = generate(base, cluster)  # one workload for every seed

    def draw(seed: int) -> Hashable:
        sc = base.model_copy(update={"seed": seed})
        run = run_policy(sc, cluster, "fenced", work, events)
        return tuple((t, d.job_id, d.assignments) for t, d in run.result.log if isinstance(d, Bind))

    honours_seed(draw)
