"""No job is bound to a node while it is drained or inside a maintenance window, no job whose
time limit would overlap a window that has not begun is bound to the window's nodes, and past a
drain's deadline nothing still runs on the node, whatever the order of submits, ends, drains
(with or without deadlines), undrains and windows."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpufence.model.decisions import Bind
from gpufence.model.events import (
    Event,
    JobFinished,
    JobSubmitted,
    MaintenanceCancelled,
    MaintenanceScheduled,
    NodeDrained,
    NodeUndrained,
)
from gpufence.sched.jobs import JobState
from gpufence.sched.scheduler import Scheduler, SchedulerConfig
from gpufence.testing.builders import ClusterBuilder, job

NODES = 3

op = st.one_of(
    st.tuples(st.just("submit"), st.integers(1, 4), st.sampled_from([None, 10.0, 40.0, 200.0])),
    st.tuples(st.just("finish"), st.integers(0, 30), st.none()),
    st.tuples(st.just("drain"), st.integers(0, NODES - 1), st.sampled_from([0.0, 7.0, None])),
    st.tuples(st.just("undrain"), st.integers(0, NODES - 1), st.none()),
    st.tuples(st.just("window"), st.integers(0, NODES - 1), st.sampled_from([5.0, 30.0, 80.0])),
    st.tuples(st.just("unwindow"), st.integers(0, NODES - 1), st.none()),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=40))
@example([("submit", 4, None), ("drain", 0, 0.0), ("submit", 1, None)])
@example([("submit", 4, None), ("drain", 0, 7.0), ("submit", 1, None), ("submit", 1, None)])
@example([("submit", 2, 10.0), ("window", 0, 5.0), ("submit", 2, 200.0), ("submit", 1, 10.0)])
def test_no_bind_on_a_closed_node(ops: list[tuple[str, int, float | None]]) -> None:
    cluster = ClusterBuilder().nodes("n", NODES, gpus=4).partition("p", ["n"]).build()
    s = Scheduler(cluster, SchedulerConfig(validate=True))
    drained: set[int] = set()
    windows: dict[int, tuple[float, float]] = {}  # node -> its window (one per node here)
    limits: dict[str, float | None] = {}
    deadlines: dict[int, float | None] = {}  # drained node -> its deadline
    now = 0.0
    for i, (kind, arg, val) in enumerate(ops):
        now += 3.0
        events: list[Event] = []
        if kind == "submit":
            b = job(f"j{i}").gpus(arg)
            if val is not None:
                b = b.limit(val)
            events.append(JobSubmitted(b.build()))
            limits[f"j{i}"] = val
        elif kind == "finish" and f"j{arg}" in s.ledger.allocs:
            events.append(JobFinished(f"j{arg}", True))
        elif kind == "drain":
            deadline = None if val is None else now + val
            events.append(NodeDrained(f"n-{arg}", "test", deadline))
            drained.add(arg)
            deadlines[arg] = deadline
        elif kind == "undrain":
            events.append(NodeUndrained(f"n-{arg}"))
            drained.discard(arg)
            deadlines.pop(arg, None)
        elif kind == "window":
            assert val is not None
            windows[arg] = (now + val, now + val + 20.0)
            events.append(MaintenanceScheduled(f"m{arg}", (f"n-{arg}",), now + val, now + val + 20))
        elif kind == "unwindow":
            windows.pop(arg, None)
            events.append(MaintenanceCancelled(f"m{arg}"))
        for d in s.step(events, now):
            if not isinstance(d, Bind):
                continue
            limit = limits[d.job_id]
            for a in d.assignments:
                assert a.node not in drained, f"{d.job_id} bound to drained n-{a.node}"
                w = windows.get(a.node)
                if w is None or now >= w[1]:
                    continue
                assert now < w[0], f"{d.job_id} bound to n-{a.node} inside its window"
                assert limit is not None and now + limit <= w[0], (
                    f"{d.job_id} (limit {limit}) bound to n-{a.node} at {now}, window at {w[0]}"
                )
        # past a drain's deadline nothing runs on the node any more (told to stop, at least)
        for node, deadline in deadlines.items():
            if deadline is None or now < deadline:
                continue
            for jid in s.ledger.jobs_on_node(node):
                assert s.job(jid).state is not JobState.RUNNING, f"{jid} runs on n-{node}"
