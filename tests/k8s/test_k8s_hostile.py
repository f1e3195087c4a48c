"""A hostile tenant against the scheduler through the real API server: values it may write on
its own pods must be refused on those pods, never stop the scheduler every tenant shares
(tests/unit/test_k8s_hostile_units.py reads each value; this is the watch path end to end)."""

from __future__ import annotations

import kobjects as k
from kenv import Env

HUGE = "1" + "0" * 400  # an integer too large for a float: it raised OverflowError


def test_k8s_a_huge_priority_is_refused_on_its_pod_and_scheduling_goes_on(env: Env) -> None:
    env.node("training", gpus=2)
    s = env.start()
    s.wait_ready()
    running = env.pod(gpus=1)
    env.bound(running)
    # on a waiting pod: read at submit
    bad = env.pod(gpus=1, annotations={"gpufence.io/priority": HUGE})
    cond = k.wait("a rejection", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, bad)))
    assert cond["reason"] == "gpufence/Rejected" and "gpufence.io/priority" in cond["message"]
    assert len(cond["message"]) < 400, cond  # the value is cut, not copied whole
    # on a running pod: read as a change of priority (kubectl annotate)
    path = f"/api/v1/namespaces/{env.ns}/pods/{running}"
    patch = {"metadata": {"annotations": {"gpufence.io/priority": HUGE}}}
    k.ok(env.kc, "PATCH", path, patch, content_type=k.MERGE)
    good = env.pod(gpus=1)
    assert env.bound(good)
    assert s.proc.poll() is None, s.log_tail()
    assert k.node_of(env.kc, env.ns, running) and not k.node_of(env.kc, env.ns, bad)


def test_k8s_a_garbage_state_record_is_said_and_the_scheduler_starts_clean(env: Env) -> None:
    """The state Lease edited by hand: JSON nested past the parser's depth, an attempt of
    1e999, a value that is not JSON. The scheduler said each and started with whole budgets;
    before, RecursionError escaped the record's load and the process died at start-up."""
    env.node("training", gpus=1)
    notes = {
        "gpufence.io/preemptions": "[" * 100_000,
        "gpufence.io/fair-share": "{not json",
        "gpufence.io/requeued": '{"Job/x": ["ns/j", 1e999]}',
    }
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "gpufence-scheduler-state", "namespace": env.ns, "annotations": notes},
        "spec": {},
    }
    path = f"/apis/coordination.k8s.io/v1/namespaces/{env.ns}/leases"
    k.ok(env.kc, "POST", path, lease, expect=201)
    s = env.start(extra=["--lease-namespace", env.ns])
    s.wait_ready()
    assert env.bound(env.pod(gpus=1))
    assert s.proc.poll() is None, s.log_tail()
    said = s.log_path_text()
    assert all(f"state record: {key} is not" in said for key in notes), said[-3000:]
