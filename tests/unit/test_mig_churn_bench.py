"""bench/mig_churn.py: the smallest-fit baseline follows its rule, gpufence keeps room for a
4g beside a running 1g, and the figures count withdrawn requests at their patience."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import mig_churn as mc


def _args(*extra: str):  # type: ignore[no-untyped-def]
    return mc.parse_args(["--gpus", "1", "--delay", "30", *extra])


def test_smallest_fit_takes_the_lowest_start_and_strands_the_4g() -> None:
    reqs = [
        mc.Request("a", "1g", 0.0, 1000.0, 7200.0),
        mc.Request("b", "4g", 10.0, 100.0, 7200.0),
    ]
    base = mc.smallest_fit(_args(), reqs)
    assert base == {"a": 0.0, "b": 1000.0}  # 1g@0 sits on the only 4g start until it ends
    ours = mc.gpufence(_args(), reqs)
    # uncut GPU: a re-cut for a (t=0..30), then one around a for b (30..60): 4g@0 beside 1g@6
    assert ours == {"a": 30.0, "b": 60.0}


def test_a_request_that_never_starts_counts_its_patience() -> None:
    reqs = [
        mc.Request("a", "7g", 0.0, 5000.0, 7200.0),
        mc.Request("b", "7g", 1.0, 10.0, 600.0),
    ]
    started = mc.smallest_fit(_args(), reqs)
    assert started == {"a": 0.0}
    f = mc.figures(reqs, started, ("7g",))
    assert (f.requests, f.accepted, f.p95_wait_s) == (2, 1, 600.0)
    assert f.work_h == 7 * 5000 / 3600


def test_the_stream_is_seeded() -> None:
    a = mc.stream(mc.parse_args(["--gpus", "4", "--hours", "2", "--seed", "5"]))
    b = mc.stream(mc.parse_args(["--gpus", "4", "--hours", "2", "--seed", "5"]))
    assert a == b and len(a) > 10


def test_the_bound_is_the_work_of_every_request_over_the_baselines() -> None:
    reqs = [
        mc.Request("a", "7g", 0.0, 3600.0, 7200.0),
        mc.Request("b", "1g", 1.0, 3600.0, 60.0),
    ]
    base = mc.figures(reqs, {"a": 0.0}, mc.SIZES)  # b withdrawn
    assert mc.accepted_bound(reqs, base) == 8 / 7


def test_a_checkpointable_4g_is_stopped_for_a_7g_and_resumes() -> None:
    """Two 4g training jobs hold both GPUs; the 7g waits for one to end under smallest-fit
    (t=5000) but gpufence stops a (aged past min_runtime_s 600) at 700, re-cuts GPU 0 for c
    (ready 790) and a resumes when c ends (stopped 760, bound 920). Each of these fails without
    its part: a victim requeued ahead of c taking GPU 0 back (c then waits to 5240 after a
    second stop), or a drain of the empty GPU 0 for a (c to 7200)."""
    reqs = [
        mc.Request("a", "4g", 0.0, 5000.0, 7200.0, True),
        mc.Request("b", "4g", 0.0, 5000.0, 7200.0, True),
        mc.Request("c", "7g", 700.0, 100.0, 7200.0),
    ]
    args = _args("--gpus", "2")
    assert mc.smallest_fit(args, reqs) == {"a": 0.0, "b": 0.0, "c": 5000.0}
    stops = mc.Stops()
    assert mc.gpufence(args, reqs, stops) == {"a": 30.0, "b": 60.0, "c": 790.0}
    assert (stops.stops, stops.resume_waits) == (1, [160.0])
    # a ran 30..760, then from 920 for what it had left (4270 s) plus 120 s of reload
    assert (4, 920.0, 920.0 + 4270.0 + 120.0) in stops.busy
    none = mc.Stops()
    assert mc.gpufence(_args("--gpus", "2", "--defrag-budget", "0"), reqs, none)["c"] == 5060.0
    assert none.stops == 0


def test_without_mig_rules_the_stranded_4g_starts_beside_the_1g() -> None:
    """The reference without MIG's geometry: 1g@0 leaves 6 interchangeable slices, so the 4g
    that smallest-fit strands behind it starts at once."""
    reqs = [
        mc.Request("a", "1g", 0.0, 1000.0, 7200.0),
        mc.Request("b", "4g", 10.0, 100.0, 7200.0),
        mc.Request("c", "3g", 20.0, 100.0, 7200.0),  # 1 + 4 + 3 > 7: waits for b
    ]
    assert mc.smallest_fit(_args(), reqs, ruled=False) == {"a": 0.0, "b": 10.0, "c": 110.0}
