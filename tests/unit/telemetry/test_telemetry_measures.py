"""telemetry/: each measure's definition on hand-made data, and the places that must agree
with it (the core's FGD fragmentation model, the control plane's largest-gang gauge)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufence.control.observe.views import largest_gang
from gpufence.sched.placement.scoring import PodSpec, TypicalWorkload, node_frag
from gpufence.sched.scheduler import Scheduler
from gpufence.telemetry.capacity import (
    Demand,
    NodeFree,
    fragment_milli,
    largest_placeable_gang,
    pool_fragmentation,
    whole_gpu_pool,
)
from gpufence.telemetry.delays import JobTimes, completion_times, queue_delays
from gpufence.telemetry.distribution import mean_ci95, percentiles
from gpufence.telemetry.incidents import counts_as_loss, lost_gpu_hours
from gpufence.telemetry.interconnect import link_class_summary
from gpufence.telemetry.slo import attainment, within_slo, worst_window
from gpufence.testing.builders import ClusterBuilder


def test_percentiles_and_the_interval_over_seeds() -> None:
    assert percentiles([1, 2, 3, 4]) == {"p50": 2.5, "p95": 3.85, "p99": 3.97, "max": 4.0}
    assert percentiles([]) == {"p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    iv = mean_ci95([1, 2, 3, 4, 5])  # s = 1.5811, t(0.975, 4) = 2.776
    assert iv.mean == 3.0
    assert iv.high - iv.mean == pytest.approx(2.776 * 1.58114 / 5**0.5, rel=1e-4)
    assert mean_ci95([7.0]).low == 7.0


JOBS = [
    JobTimes("training", 0.0, 10.0, 110.0, ended=False),  # waited 10, done at 110
    JobTimes("training", 0.0, 50.0, None, ended=False),  # running at the horizon
    JobTimes("training", 100.0, None, None, ended=False),  # still waiting at 1,000
    JobTimes("training", 0.0, None, None, ended=True),  # cancelled while pending: neither
    JobTimes("serving", 0.0, 5.0, None, ended=False),
]


def test_queue_delay_started_and_all_with_the_censored_counted() -> None:
    q = queue_delays(JOBS, horizon=1000.0)
    assert q["started"]["training"]["n"] == 2
    assert q["started"]["training"]["max"] == 50.0
    assert q["all"]["training"]["n"] == 3
    assert q["all"]["training"]["censored"] == 1
    assert q["all"]["training"]["max"] == 900.0  # 1,000 − 100: a lower bound on its wait
    assert q["all"]["all"]["n"] == 4


def test_jct_completed_and_all_without_serving() -> None:
    j = completion_times(JOBS, horizon=1000.0)
    assert j["completed"]["training"] == {
        "p50": 110.0,
        "p95": 110.0,
        "p99": 110.0,
        "max": 110.0,
        "n": 1,
    }
    assert j["all"]["training"]["n"] == 3 and j["all"]["training"]["censored"] == 2
    assert "serving" not in j["all"]


def test_fragmentation_whole_node_and_whole_gpu_references() -> None:
    rows = [[1000] * 8, [1000] * 3 + [0] * 5, [0] * 8]  # free, partly used, full
    # whole node: the 3 free GPUs of the partly used node are what an 8-GPU gang cannot use
    assert pool_fragmentation(rows, "exclusive") == pytest.approx(3 / 24)
    assert whole_gpu_pool([8, 3, 0], [8, 8, 8]) == (pytest.approx(3 / 24), 8)
    shares = [[1000, 500, 250, 0]]  # a fractional node: 750 milli on partly used GPUs
    assert pool_fragmentation(shares, "fractional") == pytest.approx(750 / 4000)
    assert largest_placeable_gang(rows) == 8


_free = st.lists(st.sampled_from([0, 100, 250, 500, 750, 900, 1000]), min_size=1, max_size=8)
_pods = st.lists(
    st.tuples(
        st.sampled_from([0, 1000, 2000, 8000]),  # CPU milli
        st.sampled_from([0, 250, 500, 1000]),  # milli per GPU (0 = CPU-only)
        st.integers(1, 4),  # GPUs
        st.integers(1, 20),  # count
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(nodes=st.lists(st.tuples(_free, st.integers(0, 16000)), min_size=1, max_size=5), pods=_pods)
def test_the_definition_is_the_cores_fgd_model(
    nodes: list[tuple[list[int], int]], pods: list[tuple[int, int, int, int]]
) -> None:
    """bench/openb.py reports the core's vectorised FGD fragmentation: it must be this one."""
    counts: Counter[PodSpec] = Counter()
    for cpu, milli, gpus, n in pods:
        if milli == 0:
            spec = PodSpec(cpu, 0, 0)  # CPU-only
        elif milli < 1000:
            spec = PodSpec(cpu, milli, 1)  # a share of one GPU
        else:
            spec = PodSpec(cpu, 1000, gpus)
        counts[spec] += n
    wl = TypicalWorkload()
    wl.set_counts(counts)
    demands = [Demand(s.milli, s.gpus, p, s.cpu_milli, s.gpu_types) for s, p in wl.dist]
    for free, cpu in nodes:
        ours = fragment_milli([NodeFree(tuple(free), cpu, "H100-80GB")], demands)
        assert ours == pytest.approx(node_frag(tuple(free), cpu, "H100-80GB", wl))


def test_the_control_planes_largest_gang_gauge_is_this_definition() -> None:
    c = ClusterBuilder().nodes("n", 3, gpus=8).partition("p", ["n"]).build()
    scheduler = Scheduler(c)  # the gauge reads the scheduler's read-only query surface
    led = scheduler.ledger
    led.hold(0, "@hold:x")
    for g in range(8, 13):
        led.hold(g, "@hold:y")
    led.set_node_up(2, False)
    reconciler = SimpleNamespace(scheduler=scheduler)
    rows = [
        [1000 if led.is_free(g) else 0 for g in c.node_partition_gpus[("p", n)]]
        for n in c.partition_nodes["p"]
    ]
    assert largest_gang(reconciler, "p") == largest_placeable_gang(rows) == 7  # type: ignore[arg-type]


def test_slo_measures_over_windows() -> None:
    reqs, p99 = [100.0, 300.0, 600.0], [200.0, 310.0, 250.0]
    assert attainment(reqs, p99, 300.0) == pytest.approx(0.7)
    assert within_slo(reqs, [1.0, 0.9, 0.99]) == pytest.approx((100 + 270 + 594) / 1000)
    assert worst_window(p99, reqs) == 310.0  # the worst window, not a percentile of windows
    assert worst_window([100.0, float("inf")], [1.0, 1.0]) == float("inf")


def test_interconnect_pools_every_link_and_sample() -> None:
    samples = [{"a": 0.5}, {"a": 1.0, "b": 0.2}]
    out = link_class_summary(samples, {"a": "node_uplink", "b": "node_uplink"}, {"node_uplink": 4})
    # 8 (sample, link) pairs, 5 of them idle: values 0,0,0,0,0,0.2,0.5,1.0
    assert out["node_uplink"]["max"] == 1.0
    assert out["node_uplink"]["p50"] == 0.0
    assert out["node_uplink"]["mean"] == pytest.approx(1.7 / 8, abs=1e-4)


def test_losses_by_cause_node_failures_included() -> None:
    got = lost_gpu_hours([("node-failure", 7200.0), ("incident-preemption", 3600.0)])
    assert got == {"node_failure": 2.0, "preemption": 1.0, "total": 3.0}
    assert not counts_as_loss("interactive", "idle")
    assert not counts_as_loss("serving", "node-failure")
    assert counts_as_loss("training", "node-failure")


def test_telemetry_imports_nothing_but_the_model() -> None:
    """Importable by the simulator, the control plane and the benchmarks alike."""
    import ast
    from pathlib import Path

    import gpufence.telemetry as pkg

    allowed = ("gpufence.model", "gpufence.telemetry", "numpy", "__future__")
    stdlib = {"bisect", "collections", "dataclasses", "itertools", "math", "typing"}  # pure
    for path in Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                ok = name.startswith(allowed) or name.split(".")[0] in stdlib
                assert ok, f"{path.name} imports {name}"
