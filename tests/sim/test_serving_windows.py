"""Issue 33, item 11: each serving window was scored with the replicas running at its end. A
window in which the fleet grew is scored piece by piece, each piece with its own replicas."""

from __future__ import annotations

import math

import pytest

from gpufence.model.job import GpuRequest, Job, WorkloadClass
from gpufence.sim.contention import Contention
from gpufence.sim.latency import INF, Pools
from gpufence.sim.runner import Simulation
from gpufence.sim.scenario import Demand, Diurnal, Service
from gpufence.sim.serving import Fleet
from gpufence.sim.workloads.records import WorkItem
from gpufence.testing.builders import ClusterBuilder

RPS = 30.0  # one replica of 40 ms is overloaded (rho 1.2), two are not (0.6)


def _run() -> Fleet:
    """A 2-GPU serving fence; another serving job holds one GPU until t=30, so the fleet's
    second replica waits for it: [0, 60) runs one replica for 30 s, then two."""
    cluster = (
        ClusterBuilder()
        .nodes("s", 1, gpus=2)
        .partition("serving", ["s"], admits=frozenset({WorkloadClass.SERVING}))
        .build()
    )
    svc = Service(
        name="chat",
        slo_p99_ms=200.0,
        service_ms=40.0,
        service_cv=1.0,
        min_replicas=2,
        max_replicas=2,
        autoscale_every_s=60.0,
        network_share=0.0,
        demand=Demand(diurnal=Diurnal(base_rps=RPS, peak_rps=RPS)),
    )
    fleet = Fleet(svc, lambda _: RPS, 180.0, Contention(cluster))
    other = Job("other", WorkloadClass.SERVING, GpuRequest.whole(1), priority=1000)
    sim = Simulation(cluster, [WorkItem(other, 30.0)], controllers=[fleet])
    sim.run(until=180.0)
    return fleet


def test_a_window_the_fleet_grew_in_is_scored_piece_by_piece() -> None:
    fleet = _run()
    first, second = fleet.score()[:2]
    assert (first.start, first.end, first.replicas) == (0.0, 60.0, 2)
    assert first.pieces == ((30.0, 1), (30.0, 2))
    # half its requests met an overloaded replica: no p99 (scored with the 2 replicas at its
    # end it was that of an M/M/2 at rho 0.6)
    assert first.p99_ms == INF
    two = Pools([2], [RPS], [0.040])
    assert first.within_slo == pytest.approx(0.5 * float(two.cdf(0.2)[0]), rel=1e-9)
    assert second.pieces == ()  # two replicas throughout
    assert second.p99_ms == pytest.approx(float(two.quantile(0.99)[0]) * 1000.0, rel=1e-9)


def test_the_run_p99_weighs_the_pieces_by_their_requests() -> None:
    fleet = _run()
    assert math.isinf(fleet.p99_overall_ms())  # a quarter of all requests met overload
    assert fleet.within_slo() == pytest.approx(
        0.75 * float(Pools([2], [RPS], [0.040]).cdf(0.2)[0]), rel=1e-9
    )
