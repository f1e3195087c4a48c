"""The simulator takes a user's change (``JobUpdated``, injected with ``At``) through the same
core as the control plane: a lowered time limit stops a running job at it, a raised priority
runs a waiting job first, and a held job waits until released. No update logic lives in sim/."""

from __future__ import annotations

from gpufence.model.decisions import Bind, Stop
from gpufence.model.events import JobHeld, JobReleased, JobUpdated
from gpufence.sched.jobs import JobState
from gpufence.sim.runner import Simulation
from gpufence.sim.workloads.records import At, WorkItem
from gpufence.testing.builders import ClusterBuilder, job


def cluster():  # type: ignore[no-untyped-def]
    return ClusterBuilder().nodes("n", 1, gpus=2).partition("p", ["n"]).build()


def item(jid: str, at: float, run_s: float, limit: float | None = None) -> WorkItem:
    b = job(jid).gpus(2).at(at)
    return WorkItem((b.limit(limit) if limit is not None else b).build(), run_s)


def binds(sim: Simulation) -> list[tuple[float, str]]:
    return [(t, d.job_id) for t, d in sim.log if isinstance(d, Bind)]


def test_a_lowered_limit_stops_the_simulated_job_there() -> None:
    sim = Simulation(
        cluster(), [item("j", 0, 500, limit=1000)], [At(10, JobUpdated("j", time_limit_s=100))]
    )
    sim.run()
    stops = [(t, d.reason) for t, d in sim.log if isinstance(d, Stop)]
    assert stops == [(100.0, "time-limit")]
    assert sim.jobs["j"].state is JobState.FAILED


def test_a_raised_priority_and_a_hold_reorder_the_simulated_queue() -> None:
    work = [item("run", 0, 100), item("a", 1, 10), item("b", 2, 10), item("c", 3, 10)]
    events = [
        At(5, JobUpdated("c", priority=5)),  # c first, then a, then b ...
        At(6, JobHeld("a")),  # ... but a is held until after b ran
        At(115, JobReleased("a")),
    ]
    sim = Simulation(cluster(), work, events)
    sim.run()
    assert binds(sim) == [(0, "run"), (100, "c"), (110, "b"), (120, "a")]
