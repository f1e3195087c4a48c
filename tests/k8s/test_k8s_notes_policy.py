"""deploy/06-placement-notes-policy.yaml on the real API server: nobody creates a pod with a
placement note or changes one on a pod; the scheduler's binds (which write the notes through
the binding subresource) still go through."""

from __future__ import annotations

import json
from pathlib import Path

import kapply
import kobjects as k
from kenv import Env

POLICY = Path(__file__).resolve().parents[2] / "deploy" / "06-placement-notes-policy.yaml"


def _create_with_note(env: Env, name: str) -> tuple[int, object]:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"gpufence.io/gang-plan": "[]"}},
        "spec": {
            "schedulerName": env.sched,
            "containers": [
                {"name": "m", "image": "busybox", "resources": {"limits": {k.GPU: "1"}}}
            ],
        },
    }
    return env.kc.request("POST", f"/api/v1/namespaces/{env.ns}/pods", body)


def test_k8s_placement_notes_are_written_only_through_binds(env: Env) -> None:
    kapply.apply_all(env.kc, kapply.documents(POLICY))
    # the policy takes effect once the API server has loaded it
    status, body = k.wait(
        "the policy in force",
        lambda: (r := _create_with_note(env, f"probe-{k.name('p')}"))[0] != 201 and r,
        30,
        every=0.5,
    )
    assert status in (403, 422) and "placement notes" in json.dumps(body), body
    node = env.node("training", gpus=2)
    env.start().wait_ready()
    pod = env.pod(gpus=1)
    assert env.bound(pod) == node  # the bind writes its note: allowed
    note = k.get_pod(env.kc, env.ns, pod)["metadata"]["annotations"]["gpufence.io/gang-plan"]
    forged = json.dumps([{"pod": pod, "node": node, "gpus": [0, 1]}])
    for patch in (
        {"metadata": {"annotations": {"gpufence.io/gang-plan": forged}}},
        {"metadata": {"annotations": {"gpufence.io/gang-plan": None}}},
    ):
        status, body = env.kc.request(
            "PATCH", f"/api/v1/namespaces/{env.ns}/pods/{pod}", patch, content_type=k.MERGE
        )
        assert status in (403, 422), (status, body)
    assert (
        k.get_pod(env.kc, env.ns, pod)["metadata"]["annotations"]["gpufence.io/gang-plan"] == note
    )
    # other annotations stay the user's own
    status, _ = env.kc.request(
        "PATCH",
        f"/api/v1/namespaces/{env.ns}/pods/{pod}",
        {"metadata": {"annotations": {"team": "vision"}}},
        content_type=k.MERGE,
    )
    assert status == 200
